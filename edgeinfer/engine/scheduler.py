"""The scheduler: which tokens of which streams go into the next llama_decode, and who owns which KV.

Pure Python; it knows nothing of llama.cpp. Each stream has `tokens` (prompt plus
generated) and `n_computed`, the number of those already in the KV cache. A step
moves every running stream's `n_computed` towards `len(tokens)` under one token
budget: a decoding stream needs one token, a new prompt takes what budget is left
(chunked prefill), so there is no separate prefill phase.

The KV cache holds running streams, and with `keep_finished` finished conversations too. A
stream that ends hands its KV to the cache tiers (`KvCache.save`: host RAM, then disk) and its
sequence is freed; one that ends in a step's post-processing does so once the step's events are
out (`retire_ended`, at the latest when the next step is planned), so its caller does not wait on
the copy for its last token. With `keep_finished` (one KV stream per sequence) an ended
conversation stays in its sequence instead, as in llama-server's slots: the next prompt that
continues it resumes there, with no copy out and back (for 1k tokens of SmolLM2 a save is 9.5 ms
and a restore 5.9); it goes to the tiers only when its sequence is wanted for another stream, when
a prompt needs its prefix elsewhere, or at `release_kept`. A new prompt that shares a saved prefix
gets it restored (`KvCache.restore`), or, when a running stream computes the same prefix, copied
from that stream once it is there.
The scheduler moves ownership; the KvCache (the engine's, or a fake in tests) moves
the bytes, right away, in the order the scheduler calls it.

KV cells are accounted by reservation: a request reserves what it can occupy at most
when admitted, so a running stream never runs out of cells. With one KV stream per
sequence (`cells_per_seq`) each stream has its own fixed share and admission needs only
a free sequence; with one unified cache the reservations share the context.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Protocol

from edgeinfer.engine.prefix import PrefixIndex
from edgeinfer.engine.step import BatchItem, StepOutput, StepPlan
from edgeinfer.engine.stream import Group, Status, Stream
from edgeinfer.errors import QueueFullError

__all__ = ["BatchItem", "Group", "KvCache", "Scheduler", "Status", "StepOutput", "StepPlan", "Stream"]

# Prefixes shorter than this are computed again rather than restored, copied or waited for.
MIN_SHARE = 16


def _worth_copying(live: int, held: int) -> bool:
    """A running stream's prompt prefix of `live` tokens is worth copying (and waiting a step for, when it is
    not computed yet) over the `held` tokens a kept sequence or the tiers give, only if it adds MIN_SHARE:
    the wait costs a step, and with a KV stream per sequence the copy may move the source's whole stream
    (on a GPU, or from a source filling more than half of it: Context.seq_share)."""
    return live >= held + MIN_SHARE


@dataclass(slots=True)
class Kept:
    """A finished conversation still in its sequence."""

    tokens: list[int]  # what the sequence holds
    saved: bool = False  # the tiers hold a copy too


class KvCache(Protocol):
    """What the scheduler asks of the KV cache and its tiers; each call takes effect at once, in call order."""

    def rm(self, seq: int, p0: int = 0) -> None:
        """Drop positions p0 and after of seq (p0 = 0: all of it)."""

    def share(self, src: int, dst: int, n: int) -> bool:
        """dst holds src's first n positions from now on (dst was empty). True when the bytes move only at the
        next decode (a whole KV stream copied): until then neither sequence may be freed for another."""

    def save(self, seq: int, tokens: list[int]) -> None:
        """Keep seq's KV, which holds `tokens`, in the tiers for a later prompt; seq is freed after."""

    def longest(self, tokens: list[int]) -> tuple[int, int]:
        """(entry key, length) of the saved entry sharing the longest prefix with tokens; (-1, 0) if none."""

    def restore(self, key: int, seq: int, n: int) -> bool:
        """seq (empty) holds the entry's first n positions from now on; False if the entry could not be read."""


class Scheduler:
    """Holds waiting and running streams, plans each step and hands out KV sequences."""

    def __init__(
        self,
        kv: KvCache,
        n_ctx: int,
        max_streams: int,
        token_budget: int,
        cells_per_seq: int | None = None,
        max_queue: int | None = None,
        keep_finished: bool = False,
        write_through: bool = False,
    ) -> None:
        if token_budget < max_streams:
            raise ValueError("token budget must be at least the number of streams")
        self.kv = kv
        self.n_ctx = n_ctx
        self.max_streams = max_streams
        self.token_budget = token_budget
        self.cells_per_seq = cells_per_seq  # None: one unified cache of n_ctx cells
        self.max_queue = max_queue
        self.waiting: deque[Group] = deque()
        self.running: list[Stream] = []
        self.free_seqs: list[int] = list(range(max_streams - 1, -1, -1))
        self.live = PrefixIndex()  # prompts of running streams, by stream id
        self._live_streams: dict[int, Stream] = {}
        self.reserved = 0  # cells reserved by admitted groups
        # Sequences in a copy whose bytes land at the next decode: not saved, not reused before it.
        self._copying: set[int] = set()
        self._quarantine: list[int] = []
        self._next_id = 0
        self._room_freed = False  # a stream ended since the last preemption: a preempted one may try again
        self.preemptions = 0
        self._cancelled_waiting: list[Stream] = []
        # Streams ended in the last post-processing, still in their sequences: (seq, tokens to keep or save, or
        # None; whether they may stay in the sequence).
        self._ended: list[tuple[int, list[int] | None, bool]] = []
        # Finished conversations kept in their sequences, least recently ended first. Only with one KV stream
        # per sequence: in a unified cache their cells would be taken from the reservations of running ones.
        self.keep_finished = keep_finished and cells_per_seq is not None
        # A kept conversation is copied to the tiers as it ends too (a disk tier: a crash then loses no turn of it).
        self.write_through = write_through
        self.kept: OrderedDict[int, Kept] = OrderedDict()
        self._kept_index = PrefixIndex()  # their tokens, by sequence
        self.resumed_in_place = 0  # prompts that went on in a kept sequence
        self.lost_saves = 0  # kept conversations whose copy to the tiers failed while a step was planned
        # Counters for stats.
        self.prompt_tokens_cached = 0
        self.prompt_tokens_computed = 0

    # --- requests ---------------------------------------------------------

    def reserve_of(self, n_prompt: int, n: int, max_new: int) -> int:
        """KV cells a request can occupy at most: per stream with a stream each, else the shared prompt once."""
        if self.cells_per_seq is not None:
            return n * (n_prompt + max_new)
        return n_prompt + n * max_new

    def add(self, prompt: list[int], n: int, max_new: int, retain: bool = True) -> Group:
        """Queue a request of n streams (checked by the engine: it fits); QueueFullError when the queue is full."""
        group = Group(list(prompt), n, max_new, self.reserve_of(len(prompt), n, max_new), retain=retain and n == 1)
        fits = len(prompt) + max_new <= (self.cells_per_seq or self.n_ctx) and group.reserve <= self.n_ctx
        assert prompt and 1 <= n <= self.max_streams and fits, "the engine checks requests"
        if self.max_queue is not None and self._queued() >= self.max_queue:
            raise QueueFullError(f"the queue is full ({self.max_queue} waiting requests); retry shortly")
        for i in range(n):
            s = Stream(self._next_id, group, i, list(prompt), len(prompt), max_new)
            self._next_id += 1
            group.streams.append(s)
        group.n_live = n
        self.waiting.append(group)
        return group

    def _queued(self) -> int:
        """Waiting groups that will not start at the next step: the ones beyond the free stream slots.

        A request that arrives while a slot is free is not queued, even before the engine
        thread has admitted it, so a burst does not see the queue full for a moment.
        """
        free = self.max_streams - len(self.running)
        queued = 0
        for g in self.waiting:
            if queued == 0 and g.n <= free:
                free -= g.n
            else:
                queued += 1
        return queued

    def cancel(self, stream: Stream) -> None:
        """Ask for a stream to stop; it is finished and its KV freed at the next step."""
        stream.cancel_requested = True

    @property
    def n_waiting(self) -> int:
        return sum(g.n_live for g in self.waiting)

    @property
    def cells_used(self) -> int:
        return self.reserved

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._cancelled_waiting or self._ended)

    # --- the step ---------------------------------------------------------

    def schedule(self, drafts: dict[int, list[int]] | None = None) -> StepPlan:
        """Plan the next step; `drafts` (stream id -> draft tokens) ride along with their streams' next token."""
        drafts = drafts or {}
        self.retire_ended()
        finished = self._apply_cancellations()
        self._admit()
        self._resolve_shares()
        items: list[BatchItem] = []
        budget = self.token_budget
        # Decoding streams first: one token each (plus any draft), so running streams never stall.
        n_decoding = sum(1 for s in self.running if not self._blocked(s) and len(s.tokens) - s.n_computed == 1)
        spare = budget - n_decoding
        for s in self.running:
            if not self._blocked(s) and len(s.tokens) - s.n_computed == 1:
                draft = drafts.get(s.id, [])[: max(0, spare)]
                spare -= len(draft)
                items.append(BatchItem(s, [s.tokens[-1], *draft], s.n_computed, self._samplers(s), len(draft)))
                budget -= 1 + len(draft)
        # Then prompt chunks, oldest first, in what budget is left.
        for s in self.running:
            left = len(s.tokens) - s.n_computed
            if budget <= 0:
                break
            if self._blocked(s) or left <= 1:
                continue
            chunk = min(left, budget)
            samplers = self._samplers(s) if chunk == left else []
            items.append(BatchItem(s, s.tokens[s.n_computed : s.n_computed + chunk], s.n_computed, samplers))
            budget -= chunk
        # With a KV stream per sequence llama.cpp computes only consecutive, increasing sequence ids
        # in one pass: in any other order a step splits into many small passes.
        items.sort(key=lambda it: it.stream.seq)
        return StepPlan(items, finished)

    def postprocess(self, plan: StepPlan, outputs: list[StepOutput]) -> list[Stream]:
        """After the decode: the plan's batch is in the KV cache; apply each stream's output; return the ended ones."""
        # The decode has landed every pending copy: those sequences may be saved and reused again.
        self._copying.clear()
        if self._quarantine:
            self._free(self._quarantine)
            self._quarantine.clear()
        self._complete(plan)
        ended = []
        for out in outputs:
            s = out.stream
            if out.n_rejected > 0:
                s.n_computed -= out.n_rejected
                self.kv.rm(s.seq, s.n_computed)
            s.tokens.extend(out.tokens)
            if out.status is not None:
                self.finish(s, out.status, later=True)
                ended.append(s)
        return ended

    def has_ended(self) -> bool:
        """Whether streams ended by the last post-processing still hold their sequences (retire_ended's work)."""
        return bool(self._ended)

    def retire_ended(self) -> None:
        """Save and free the sequences of the streams the last post-processing ended (their callers have their
        last tokens by now: the copy to the tiers, 13 ms for 1k tokens of SmolLM2, no longer delays them)."""
        ended, self._ended = self._ended, []
        failed: BaseException | None = None
        for seq, tokens, keep in ended:
            try:
                self._retire(seq, tokens, keep)
            except Exception as e:  # the sequence is freed all the same; the others are still saved
                failed = failed or e
        if failed is not None:
            raise failed

    def _complete(self, plan: StepPlan) -> None:
        """Record that the plan's batch is now in the KV cache."""
        for it in plan.items:
            s = it.stream
            s.n_computed += len(it.tokens)
            computed_prompt = min(len(it.tokens), max(0, s.n_prompt - it.pos0))
            self.prompt_tokens_computed += computed_prompt
            for child in it.samplers:
                if child is not s:
                    # The child holds the leader's prompt from now on.
                    self._share(s.seq, child.seq, s.n_computed)
                    child.n_computed = s.n_computed
                    child.n_cached = s.n_cached
                    child.fork_pending = False

    def finish(self, stream: Stream, status: Status, later: bool = False) -> None:
        """End a running stream; its KV goes to the cache tiers (or away) and its sequence is freed: now, or
        with `later` at `retire_ended`."""
        assert status.finished and stream.status == Status.RUNNING
        stream.status = status
        group = self._leave(stream, save=stream.group.retain and status != Status.ERROR, later=later, keep=True)
        self._room_freed = True
        if group.n_live == 0:
            self.reserved -= group.reserve

    def preempt(self, stream: Stream) -> None:
        """Take a running stream out of the KV cache to make room: its KV goes to the tiers, it waits at the
        front of the queue, and once another stream has ended it resumes (restored, or recomputed) where it was."""
        assert stream.status == Status.RUNNING
        old = self._leave(stream, save=True)
        share = old.reserve if old.n_live == 0 else self.reserve_of(0, 1, old.max_new)
        old.reserve -= share
        self.reserved -= share
        g = Group(list(stream.tokens), 1, stream.max_new, self.reserve_of(stream.n_prompt, 1, stream.max_new))
        g.retain, g.streams, g.n_live, g.preempted = old.retain, [stream], 1, True
        stream.group, stream.status, stream.seq = g, Status.WAITING, -1
        stream.n_computed = stream.n_cached = 0
        stream.share_src, stream.fork_pending = None, False
        self.waiting.appendleft(g)
        self._room_freed = False
        self.preemptions += 1

    def _leave(self, stream: Stream, save: bool, later: bool = False, keep: bool = False) -> Group:
        """What finishing and preempting share: the stream leaves the running ones and the live prompts, its KV
        goes to the tiers (when `save`, and worth saving) or with `keep` may stay in its sequence, else its
        sequence is freed (with `later`: all at `retire_ended`), and if it was computing its group's prompt a
        waiting fork takes over. Returns its group, one live stream fewer."""
        self.running.remove(stream)
        if stream.id in self.live:
            self.live.remove(stream.id)
            del self._live_streams[stream.id]
        keep = save and stream.n_computed >= MIN_SHARE and stream.seq not in self._copying
        tokens = stream.tokens[: stream.n_computed] if keep else None
        if later:
            self._ended.append((stream.seq, tokens, keep))
        else:
            self._retire(stream.seq, tokens, keep)
        group = stream.group
        group.n_live -= 1
        if group.n_live > 0 and not stream.fork_pending:
            self._hand_over_prompt(group)
        return group

    # --- internals --------------------------------------------------------

    def _apply_cancellations(self) -> list[Stream]:
        done = self._cancelled_waiting
        self._cancelled_waiting = []
        for s in list(self.running):
            if s.cancel_requested:
                self.finish(s, Status.CANCELLED)
                done.append(s)
        for g in list(self.waiting):
            for s in g.streams:
                if s.cancel_requested and s.status == Status.WAITING:
                    s.status = Status.CANCELLED
                    g.n_live -= 1
                    done.append(s)
            if g.n_live == 0:
                self.waiting.remove(g)
        return done

    def _admit(self) -> None:
        while self.waiting:
            g = self.waiting[0]
            if len(self.running) + g.n > self.max_streams or len(self.free_seqs) + len(self.kept) < g.n:
                return
            if self.n_ctx - self.reserved < g.reserve:
                return  # unified cache: wait for running streams to free their cells
            if g.preempted and not self._room_freed and self.running:
                return  # it was put back for lack of room: wait until a stream ends
            self.waiting.popleft()
            self._start(g)

    def _start(self, g: Group) -> None:
        streams = [s for s in g.streams if s.status == Status.WAITING]
        leader = streams[0]
        last = len(g.prompt) - 1  # the last prompt token is computed again: its logits start the reply
        if not self._resume(leader, g.prompt):
            leader.seq = self._take_seq()
            # The longest prefix already there: saved in the tiers, or a running stream's prompt.
            key, saved_len = self.kv.longest(g.prompt)
            live_id, live_len = self.live.longest(g.prompt)
            held = min(saved_len, last) if key >= 0 else 0
            reuse = held if held >= MIN_SHARE else 0
            live = min(live_len, last) if live_id >= 0 else 0
            if not _worth_copying(live, reuse) and reuse and self.kv.restore(key, leader.seq, reuse):
                leader.n_computed = leader.n_cached = reuse
                self.prompt_tokens_cached += reuse
            elif live >= MIN_SHARE:
                # A running stream computes (or has computed) this prefix: copy it once it is there.
                leader.share_src = self._live_streams[live_id]
                leader.share_len = live
        for s in streams[1:]:
            s.seq = self._take_seq()
            s.fork_pending = True
        for s in streams:
            s.status = Status.RUNNING
            self.running.append(s)
        self.live.insert(leader.id, g.prompt)
        self._live_streams[leader.id] = leader
        self.reserved += g.reserve

    def _resume(self, leader: Stream, prompt: list[int]) -> bool:
        """Start the leader in the kept sequence holding the longest prefix of its prompt, when the tiers hold no
        longer one, no running stream's prompt is worth copying instead and the running sequences stay as
        consecutive as in any other. That last rule waits while other requests wait to start: they take the
        sequences in between (their own kept ones, or free ones by `_take_seq`), so a burst of returning
        conversations resumes in place in any order of arrival. A kept prefix that cannot be resumed in place
        is saved to the tiers, for the restore that follows."""
        seq, n = self._kept_index.longest(prompt)
        reuse = min(n, len(prompt) - 1)
        if seq < 0 or reuse < MIN_SHARE:
            return False
        kept = self.kept[seq]
        live = min(self.live.longest(prompt)[1], len(prompt) - 1)
        if (
            n < self.kv.longest(prompt)[1]
            or _worth_copying(live, reuse)
            or (not self.waiting and self._runs_with(seq) > min(self._runs_with(c) for c in self._candidates()))
        ):
            self._save_kept(seq, kept)
            return False
        del self.kept[seq]
        self._kept_index.remove(seq)
        if not kept.saved and len(kept.tokens) - reuse > len(kept.tokens) // 4:
            self._try_save(seq, kept.tokens)  # most of it is another conversation: keep that in the tiers
        self.kv.rm(seq, reuse)
        leader.seq = seq
        leader.n_computed = leader.n_cached = reuse
        self.prompt_tokens_cached += reuse
        self.resumed_in_place += 1
        return True

    def _take_seq(self) -> int:
        """A sequence for a new stream: one that leaves the running sequences in the fewest runs of consecutive
        ids (llama.cpp decodes one KV stream per sequence in one pass only over consecutive ids); a free one
        before a kept one, which goes to the tiers first; the lowest, then the least recently kept."""
        order = {seq: i for i, seq in enumerate(self.kept)}
        seq = min(self._candidates(), key=lambda c: (self._runs_with(c), c in order, order.get(c, c)))
        if seq in self.kept:
            kept = self.kept.pop(seq)
            self._kept_index.remove(seq)
            if not kept.saved:
                self._try_save(seq, kept.tokens)
            self._release_seq(seq)
        self.free_seqs.remove(seq)
        return seq

    def _candidates(self) -> list[int]:
        return [*self.free_seqs, *self.kept]

    def _runs_with(self, seq: int) -> int:
        """Runs of consecutive ids among the running streams' sequences and seq."""
        seqs = sorted({s.seq for s in self.running if s.seq >= 0} | {seq})
        return 1 + sum(b != a + 1 for a, b in itertools.pairwise(seqs))

    def _save_kept(self, seq: int, kept: Kept) -> None:
        if not kept.saved:
            kept.saved = self._try_save(seq, kept.tokens)

    def _try_save(self, seq: int, tokens: list[int]) -> bool:
        """Save a kept conversation while planning a step. A failure (no memory for the copy) costs that
        conversation a cold start later, nothing else: it must not fail the streams being planned."""
        try:
            self.kv.save(seq, tokens)
        except Exception:
            self.lost_saves += 1
            return False
        return True

    def release_kept(self, save: bool) -> None:
        """Free every kept sequence, saving its conversation to the tiers first with `save` (at close, so that
        the disk tier holds it for a restart). Called where no decode runs: the engine thread, or after it."""
        failed: BaseException | None = None
        for seq, kept in list(self.kept.items()):
            del self.kept[seq]
            self._kept_index.remove(seq)
            try:
                self._retire(seq, kept.tokens if save and not kept.saved else None)
            except Exception as e:  # the sequence is freed all the same; the others are still saved
                failed = failed or e
        if failed is not None:
            raise failed

    def forget_kept(self) -> None:
        """Drop the kept conversations (the chat's /reset): none resumes from now on; their sequences are
        emptied and freed with the ended streams' (`retire_ended`, on the engine thread)."""
        for seq in list(self.kept):
            self._ended.append((seq, None, False))
        self.kept.clear()
        self._kept_index = PrefixIndex()

    def _resolve_shares(self) -> None:
        """Streams waiting for another's prompt prefix copy it as soon as it is computed."""
        for s in self.running:
            src = s.share_src
            if src is None:
                continue
            if src.status == Status.RUNNING and src.n_computed >= s.share_len and src.share_src is None:
                self._share(src.seq, s.seq, s.share_len)
                s.n_computed = s.n_cached = s.share_len
                self.prompt_tokens_cached += s.share_len
                s.share_src = None
            elif src.status.finished:
                s.share_src = None  # its source is gone: compute the prompt itself

    def _share(self, src: int, dst: int, n: int) -> None:
        if self.kv.share(src, dst, n):
            self._copying.update((src, dst))

    @staticmethod
    def _hand_over_prompt(group: Group) -> None:
        """The stream computing the group's prompt is gone: a waiting fork computes it instead."""
        pending = [c for c in group.streams if c.fork_pending and c.status == Status.RUNNING]
        if pending:
            pending[0].fork_pending = False

    @staticmethod
    def _blocked(s: Stream) -> bool:
        """Waiting for another stream's KV (a fork's leader, or a shared prefix)."""
        return s.fork_pending or s.share_src is not None

    @staticmethod
    def _samplers(s: Stream) -> list[Stream]:
        """The streams that sample from s's next logits: s, and its forks still waiting for the prompt."""
        if s.group.n == 1:
            return [s]
        return [s] + [c for c in s.group.streams if c.fork_pending]

    def _retire(self, seq: int, tokens: list[int] | None, keep: bool = False) -> None:
        if keep and tokens is not None and self.keep_finished:
            self.kept[seq] = Kept(tokens, saved=self.write_through and self._try_save(seq, tokens))
            self._kept_index.insert(seq, tokens)
            return
        try:
            if tokens is not None:
                self.kv.save(seq, tokens)
        finally:
            self._release_seq(seq)

    def _release_seq(self, seq: int) -> None:
        self.kv.rm(seq)
        # A sequence in a copy that has not landed yet must not take new bytes before the decode.
        if seq in self._copying:
            self._quarantine.append(seq)
        else:
            self._free([seq])

    def _free(self, seqs: list[int]) -> None:
        # Highest first: pop() hands out the lowest free sequence, so the running ones stay consecutive.
        self.free_seqs.extend(seqs)
        self.free_seqs.sort(reverse=True)
