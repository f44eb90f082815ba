"""The cache tiers behind the KV cells: finished conversations' KV in host RAM, then on disk.

The KV cells hold running streams only. When a stream ends, its sequence's KV is
serialized (llama_state_seq_get_data) into the RAM tier, keyed by the tokens it holds,
and its cells are freed at once. A later prompt that shares a prefix with an entry gets
it restored into a fresh sequence (llama_state_seq_set_data), trimmed to the shared part,
and computes only its own suffix. The RAM tier is bounded (least recently used out
first); with a disk tier every entry is also written there, so entries evicted from RAM
and a restarted server are still warm.

KvStore owns the entries and each tier's budget (pure Python and files); ContextKv is
the scheduler's KvCache over a llama.cpp context and a KvStore.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from edgeinfer.engine.disk import DiskTier, file_identity
from edgeinfer.engine.prefix import PrefixIndex
from edgeinfer.engine.stats import CacheStats
from edgeinfer.llamacpp import Context, Model
from edgeinfer.options import EngineConfig


@dataclass(slots=True)
class Entry:
    key: int
    tokens: list[int]
    blob: bytes | bytearray | None  # the serialized KV, while in RAM
    on_disk: bool = False


class KvStore:
    """Saved sequences by their tokens: RAM (LRU, `ram_bytes`) over an optional DiskTier."""

    def __init__(self, ram_bytes: int, disk: DiskTier | None = None) -> None:
        self.ram_bytes = ram_bytes
        self.disk = disk
        self.entries: dict[int, Entry] = {}
        self.ram: OrderedDict[int, Entry] = OrderedDict()  # entries with a blob, least recently used first
        self.ram_used = 0
        self.index = PrefixIndex()  # every entry's tokens, by key
        self.stats = CacheStats(ram_budget_bytes=ram_bytes)
        self._next = 0
        if disk is not None:
            for tokens in disk.load_index():
                self._add(tokens, None, on_disk=True)
            self.stats.disk_budget_bytes = disk.max_bytes

    def longest(self, tokens: list[int]) -> tuple[int, int]:
        return self.index.longest(tokens)

    def put(self, tokens: list[int], blob: bytes | bytearray) -> None:
        """Keep a sequence's KV; an entry it extends (the same conversation's earlier turn) is replaced."""
        if len(blob) > self.ram_bytes and (self.disk is None or self.disk.error is not None):
            return
        key, n = self.index.longest(tokens)
        if key >= 0 and n == len(tokens):
            self._touch(self.entries[key])  # already held (this sequence, or a longer one)
            return
        if key >= 0 and n == len(self.entries[key].tokens):
            self.drop(key)  # superseded by its continuation
        entry = self._add(tokens, blob)
        if self.disk is not None and self.disk.error is None:
            self.disk.write(tokens, blob)
            entry.on_disk = True
        self._fit_ram()

    def get(self, key: int) -> bytes | bytearray | None:
        """The entry's KV, from RAM or else from disk (kept in RAM again); None if it cannot be read."""
        entry = self.entries[key]
        if entry.blob is not None:
            self._touch(entry)
            self.stats.ram_hits += 1
            return entry.blob
        blob = self.disk.read(entry.tokens) if self.disk is not None and entry.on_disk else None
        if blob is None:
            self._drop(key)
            return None
        self.stats.disk_hits += 1
        entry.blob = blob
        self.ram[key] = entry
        self.ram_used += len(blob)
        self._fit_ram(keep=key)
        return blob

    def drop(self, key: int) -> None:
        """Forget an entry that turned out unusable."""
        entry = self.entries.get(key)
        if entry is not None:
            if self.disk is not None and entry.on_disk:
                self.disk.remove(entry.tokens)
            self._drop(key)

    def clear(self) -> None:
        """Forget every entry held in RAM (the chat's /reset); disk files stay for a later --resume."""
        for key in list(self.ram):
            entry = self.ram[key]
            if entry.on_disk:
                self._evict_blob(entry)
            else:
                self._drop(key)

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def refresh_stats(self) -> CacheStats:
        s = self.stats
        s.ram_entries, s.ram_bytes = len(self.ram), self.ram_used
        if self.disk is not None:
            s.disk_entries, s.disk_bytes = self.disk.counts()
            s.disk_error = self.disk.error
        return s

    # --- internals --------------------------------------------------------

    def _add(self, tokens: list[int], blob: bytes | bytearray | None, on_disk: bool = False) -> Entry:
        key, self._next = self._next, self._next + 1
        entry = Entry(key, list(tokens), blob, on_disk)
        self.entries[key] = entry
        self.index.insert(key, tokens)
        if blob is not None:
            self.ram[key] = entry
            self.ram_used += len(blob)
        return entry

    def _touch(self, entry: Entry) -> None:
        if entry.key in self.ram:
            self.ram.move_to_end(entry.key)

    def _fit_ram(self, keep: int = -1) -> None:
        while self.ram_used > self.ram_bytes and self.ram:
            key = next(iter(self.ram))
            if key == keep:
                if len(self.ram) == 1:
                    return
                self.ram.move_to_end(key)
                continue
            entry = self.ram[key]
            self.stats.ram_evictions += 1
            if entry.on_disk:
                self._evict_blob(entry)
            else:
                self._drop(key)

    def _evict_blob(self, entry: Entry) -> None:
        """RAM lets go of the bytes; the entry stays, on disk."""
        assert entry.blob is not None
        self.ram_used -= len(entry.blob)
        entry.blob = None
        del self.ram[entry.key]

    def _drop(self, key: int) -> None:
        entry = self.entries.pop(key)
        self.index.remove(key)
        if entry.blob is not None:
            self.ram_used -= len(entry.blob)
            del self.ram[key]


class ContextKv:
    """The scheduler's KvCache: sequence edits on a llama.cpp context, and the tiers of a KvStore."""

    def __init__(self, ctx: Context, store: KvStore | None) -> None:
        self.ctx = ctx
        self.store = store

    def rm(self, seq: int, p0: int = 0) -> None:
        self.ctx.seq_rm(seq, p0, -1)

    def share(self, src: int, dst: int, n: int) -> bool:
        return self.ctx.seq_share(src, dst, n)

    def save(self, seq: int, tokens: list[int]) -> None:
        if self.store is None or self.store.ram_bytes <= 0:
            return
        t0 = time.perf_counter()
        blob = self.ctx.seq_state(seq)
        self.store.put(tokens, blob)
        self.store.stats.saves += 1
        self.store.stats.save_seconds += time.perf_counter() - t0

    def longest(self, tokens: list[int]) -> tuple[int, int]:
        return self.store.longest(tokens) if self.store is not None else (-1, 0)

    def restore(self, key: int, seq: int, n: int) -> bool:
        assert self.store is not None
        t0 = time.perf_counter()
        blob = self.store.get(key)
        if blob is None or not self.ctx.set_seq_state(seq, blob):
            self.store.drop(key)
            self.ctx.seq_rm(seq, 0, -1)
            self.store.stats.restore_failures += 1
            return False
        self.ctx.seq_rm(seq, n, -1)  # keep the shared prefix only
        self.store.stats.restores += 1
        self.store.stats.restore_seconds += time.perf_counter() - t0
        return True


def make_store(config: EngineConfig, model: Model, ctx: Context) -> KvStore | None:
    """The cache tiers: RAM (--cache-ram), and disk (--cache-dir) keyed by what makes KV bytes reusable."""
    if config.cache_ram <= 0 and config.cache_dir is None:
        return None
    disk = None
    if config.cache_dir is not None:
        # Bytes restore only into the same model, KV type, layout and stream count (llama.cpp checks the
        # shapes, not the weights; the file hash covers those).
        layout = f"{config.kv_type}-{'unified' if ctx.kv_unified else f'per-seq{ctx.n_seq_max}'}-fa{ctx.flash_attn}"
        identity = f"{file_identity(model.path)}-{layout}"
        disk = DiskTier(config.cache_dir, identity, config.cache_dir_max << 20)
    return KvStore(config.cache_ram << 20, disk)
