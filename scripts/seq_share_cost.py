"""What copying a short prompt prefix to the other sequences costs, per-sequence KV on the CPU.

    .venv/bin/python scripts/seq_share_cost.py                 # 8 streams of 8,192 cells (serve's default shape)
    .venv/bin/python scripts/seq_share_cost.py --ctx-size 32768 --parallel 16

Sequence 0 computes a prompt of --prefix tokens; then every other sequence gets it, three ways
taking turns (best and median of --repeats), each followed by one decode of a token in each:
llama.cpp's seq_cp between streams (it moves the source's whole stream, every cell, at the next
decode), the sequence's state read once and written into each (its own cells only), and no copy
(the decode alone). Context.seq_share picks the state on the CPU where the source fills at most
half its stream.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from edgeinfer.llamacpp import Batch, Context, ContextParams, Model
from edgeinfer.models.catalog import resolve_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--ctx-size", type=int, default=65536)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=33, help="Prompt tokens copied.")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = Model(resolve_model(args.model))
    ctx = Context(
        model,
        ContextParams(
            n_ctx=args.ctx_size,
            n_batch=max(512, args.prefix),
            n_seq_max=args.parallel,
            n_threads=args.threads,
            flash_attn="off",
        ),
    )
    batch = Batch(max(args.prefix, args.parallel))
    prefix = [1000 + i for i in range(args.prefix)]
    others = range(1, args.parallel)

    def prompt() -> None:
        ctx.clear()
        batch.clear()
        batch.add(0, prefix, 0, True)
        assert ctx.decode(batch)

    def one_token_each() -> None:
        batch.clear()
        for seq in others:
            batch.add(seq, [5000 + seq], args.prefix, True)
        assert ctx.decode(batch)

    def by_stream() -> None:
        for seq in others:
            ctx.seq_cp(0, seq)

    def by_state() -> None:
        data = ctx.seq_state(0)
        for seq in others:
            assert ctx.set_seq_state(seq, data)

    ways: dict[str, Callable[[], None]] = {
        "whole stream (seq_cp)": by_stream,
        "state": by_state,
        "no copy": lambda: None,
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, copy in ways.items():
            prompt()
            t0 = time.perf_counter()
            copy()
            one_token_each()
            seconds[name].append(time.perf_counter() - t0)
    cells = args.ctx_size // args.parallel
    print(f"{args.prefix}-token prefix to {len(others)} sequences, {cells} cells a stream, then a token each:")
    alone = min(seconds["no copy"])
    for name, s in seconds.items():
        extra = (min(s) - alone) / len(others) * 1e3
        best, median = min(s) * 1e3, statistics.median(s) * 1e3
        print(f"  {name:22s} best {best:7.1f} ms, median {median:7.1f}; {extra:5.1f} ms a copy")
    ctx.close()
    model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
