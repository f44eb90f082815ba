"""What a decode step of one stream costs by its number of tokens: the price of a verified draft.

    .venv/bin/python scripts/step_sizes.py [--context 1000] [--sizes 1,2,3,4,6,8]

Fills one sequence with --context tokens, then times a step of n tokens after them (all with
logits, as a verification step has them), dropping them again after each: the median of 16
steps per size, taking turns between the sizes for --repeats rounds, best round. Prints each
size's time and its multiple of the one-token step: what the first draft token adds to a lone
stream's step (docs/speculation.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from edgeinfer.llamacpp import Batch
from edgeinfer.models.catalog import resolve_model
from edgeinfer.options import EngineConfig
from edgeinfer.runtime import make_engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--context", type=int, default=1000, help="Tokens in the sequence before the step.")
    ap.add_argument("--sizes", default="1,2,3,4,6,8", help="Tokens per step, comma-separated.")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: the engine's choice).")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    config = EngineConfig(
        model=resolve_model(args.model), parallel=16, ctx_size=32768, spec="off", threads=args.threads, flash_attn="off"
    )
    with make_engine(config) as engine:
        ctx = engine.ctx
        tokens = engine.tokenize("the quick brown fox jumps over the lazy dog " * (args.context // 8 + 64))
        if args.context + max(sizes) + 16 > ctx.n_ctx_seq:
            sys.exit(f"--context {args.context} leaves no room in a sequence of {ctx.n_ctx_seq} cells")
        batch = Batch(ctx.n_batch)
        for start in range(0, args.context, 256):
            batch.clear()
            batch.add(0, tokens[start : min(start + 256, args.context)], start, True)
            ctx.decode(batch)
        rounds: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(args.repeats):
            for n in sizes:
                times = []
                for i in range(16):
                    ctx.seq_rm(0, args.context, -1)
                    t0 = time.perf_counter()
                    batch.clear()
                    batch.add(0, tokens[i : i + n], args.context, True)
                    ctx.decode(batch)
                    times.append(time.perf_counter() - t0)
                rounds[n].append(statistics.median(times))
    one = min(rounds[sizes[0]])
    print(f"one stream after {args.context} tokens; multiples of the {sizes[0]}-token step")
    for n in sizes:
        print(f"{n:3d} tokens: {1000 * min(rounds[n]):6.2f} ms  {min(rounds[n]) / one:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
