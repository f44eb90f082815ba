"""How many streams, and how much context each: decided from the model's own figures and the memory there is.

By default (--ctx-size 0, --parallel 0) each stream holds the context the model was trained for,
as an agent's prompt needs (Codex's first request is 6-10k tokens, Claude Code's 12-19k), and the
number of streams follows from the KV cache's memory budget (--kv-budget, by default a quarter of
this machine's RAM), up to MAX_AUTO_STREAMS. A model trained for more context than the budget
holds gets what the budget holds, in one stream. A flag set by hand wins: --ctx-size with
--parallel 0 gives as many streams of the trained context as the cells hold, --parallel with
--ctx-size 0 gives that many streams of the trained context (within the budget).

The KV cache's size is estimated from the GGUF's own figures, before anything is loaded: per cell,
each layer keeps a key and a value row of head_count_kv x key_length (value_length) elements.
Sliding-window layers keep fewer cells than that; counting them whole errs on the side of memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeinfer.models.gguf import GGUFInfo

MAX_AUTO_STREAMS = 8  # streams chosen by memory, at most
MIN_STREAM_CELLS = 512  # a stream holds at least this much, budget or not
AUTO_BUDGET_SHARE = 4  # the KV budget by default: RAM / this
PAD = 256  # llama.cpp rounds a stream's cells up to this
# Bytes of one element of the KV cache by --kv-type (q8_0 and q4_0: blocks of 32 with a 2-byte scale).
ELEMENT_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


@dataclass(frozen=True, slots=True)
class Sizing:
    """The engine's streams and cells, and why."""

    parallel: int
    ctx_size: int  # cells for all streams
    per_stream: int  # cells one stream holds (per-seq layout)
    trained: int | None  # the context the model was trained for (None: the GGUF does not say)
    cell_bytes: int  # KV bytes per cell (an estimate from the GGUF)
    budget_bytes: int
    why: str  # one line for start-up

    @property
    def kv_bytes(self) -> int:
        return self.ctx_size * self.cell_bytes


def pad(n: int) -> int:
    return -(-n // PAD) * PAD


def ram_bytes() -> int:
    """This machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def cell_bytes(metadata: dict[str, Any], kv_type: str) -> int:
    """KV bytes per cell of one stream: keys and values of every layer (0 when the GGUF says too little)."""
    return sum(layer_cell_bytes(metadata, kv_type))


def layer_cell_bytes(metadata: dict[str, Any], kv_type: str) -> list[int]:
    """KV bytes per cell of each layer (empty when the GGUF says too little)."""
    arch = metadata.get("general.architecture", "")
    layers = int(metadata.get(f"{arch}.block_count", 0) or 0)
    heads = metadata.get(f"{arch}.attention.head_count", 0) or 0
    kv_heads: Any = metadata.get(f"{arch}.attention.head_count_kv", heads) or heads
    width = metadata.get(f"{arch}.embedding_length", 0) or 0
    head_dim = width // max(1, heads if isinstance(heads, int) else max(heads))
    k = int(metadata.get(f"{arch}.attention.key_length", head_dim) or head_dim)
    v = int(metadata.get(f"{arch}.attention.value_length", head_dim) or head_dim)
    # head_count_kv may be one figure, or one per layer (0 for a layer without attention).
    per_layer = list(kv_heads) if isinstance(kv_heads, list | tuple) else [int(kv_heads)] * layers
    element = ELEMENT_BYTES.get(kv_type, 2.0)
    return [int(h * (k + v) * element) for h in per_layer]


def size(
    metadata: dict[str, Any], ctx_size: int, parallel: int, kv_type: str, kv_budget_mib: int, unified: bool
) -> Sizing:
    """The streams and cells for these settings (0: decided here) and this model."""
    trained = metadata.get(f"{metadata.get('general.architecture', '')}.context_length")
    trained = int(trained) if trained else None
    per_cell = max(1, cell_bytes(metadata, kv_type))
    budget = kv_budget_mib << 20 if kv_budget_mib else ram_bytes() // AUTO_BUDGET_SHARE
    budget_note = f"--kv-budget {budget >> 20} MiB" if kv_budget_mib else f"the KV budget ({budget >> 20} MiB, RAM/4)"
    want = trained or 4096  # a GGUF that does not say: llama-server's default
    fits = max(MIN_STREAM_CELLS, budget // per_cell // PAD * PAD)  # cells the budget holds, all streams together

    if ctx_size and parallel:
        per = ctx_size if unified else pad(ctx_size // parallel)
        return Sizing(parallel, ctx_size, per, trained, per_cell, budget, "set by --ctx-size and --parallel")
    if ctx_size:  # cells given: as many streams of the trained context as they hold
        n = max(1, min(MAX_AUTO_STREAMS, ctx_size // want))
        per = ctx_size if unified else pad(ctx_size // n)
        return Sizing(n, ctx_size, per, trained, per_cell, budget, f"{n} streams: --ctx-size {ctx_size} / {want}")
    per = min(pad(want), max(MIN_STREAM_CELLS, fits))
    if parallel:
        n = parallel
        if per * n > fits:
            per = max(MIN_STREAM_CELLS, fits // n // PAD * PAD)
    else:
        n = max(1, min(MAX_AUTO_STREAMS, fits // per))
    trained_note = f"the model's trained context, {trained}" if trained else "4096, as the GGUF names no context"
    if per < pad(want):
        why = f"{per} cells a stream as {budget_note} holds no more ({trained_note}, wanted)"
    elif parallel:
        why = f"a stream holds {trained_note}; --parallel {n}"
    else:
        why = f"a stream holds {trained_note}; {n} streams fit {budget_note}"
    return Sizing(n, per * n, per, trained, per_cell, budget, why)


def sized(config: Any, info: GGUFInfo | None = None) -> tuple[Any, Sizing]:
    """config (an EngineConfig) with --ctx-size and --parallel decided, and how they were (reads the GGUF's
    header, about 0.1 s, unless its GGUFInfo is given)."""
    from edgeinfer.models.gguf import read_gguf

    info = info or read_gguf(config.model)
    s = size(
        info.metadata, config.ctx_size, config.parallel, config.kv_type, config.kv_budget, config.kv_layout == "unified"
    )
    if (config.ctx_size, config.parallel) == (s.ctx_size, s.parallel):
        return config, s
    batch = max(config.batch_size, s.parallel)
    return config.replace(ctx_size=s.ctx_size, parallel=s.parallel, batch_size=batch), s
