"""Distinct long contexts, packed: one KV stream per sequence against one unified KV cache, in one run.

    .venv/bin/python scripts/kv_layout.py            # multi-agent, 1 and 16 streams, 48 tokens each

Two in-process engines with the same settings but --kv-layout take turns on the multi-agent
workload (16 agents, each with its own ~1,000-token history and a new turn). Then the
same 16 requests run one after another on each engine. It prints the sweep's tables and:
- decode tok/s at 16 streams, per-seq over unified;
- per-seq at 16 streams over per-seq at 1 stream;
- the wall time of the 16 cold requests together against one after another.
"""

from __future__ import annotations

import argparse
import sys
import time

from edgeinfer.bench.progress import BarProgress
from edgeinfer.bench.report import print_sweep
from edgeinfer.bench.sweep import run_sweep, runs_in
from edgeinfer.bench.targets import EngineTarget, Target
from edgeinfer.bench.workloads import messages
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine


def one_after_another(engine: object, n: int, max_tokens: int) -> float:
    """Seconds to serve n cold multi-agent requests one at a time (a new opening: nothing cached)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    for conv in messages("multi-agent", n, head="[alone] "):
        engine.generate(engine.chat_prompt(conv), params)  # type: ignore[attr-defined]
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--flash-attn", default="auto", choices=["on", "off", "auto"], help="[auto: off on the CPU]")
    args = ap.parse_args()
    n = args.streams
    base = EngineConfig(
        parallel=n,
        ctx_size=n * 2048,
        batch_size=512,
        threads=args.threads,
        threads_batch=args.threads,
        spec="off",
        flash_attn=args.flash_attn,
    )
    engines = {layout: make_engine(base.replace(kv_layout=layout)) for layout in ("unified", "per-seq")}
    try:
        targets: list[Target] = [EngineTarget(e, layout) for layout, e in engines.items()]
        levels = [1, n]
        with BarProgress(runs_in(levels, args.repeats, len(targets))) as bar:
            sweep = run_sweep(targets, "multi-agent", levels, args.max_tokens, args.repeats, bar)
        print_sweep(sweep, print)
        alone = {layout: one_after_another(e, n, args.max_tokens) for layout, e in engines.items()}
    finally:
        for e in engines.values():
            e.close()
    one, many = sweep.levels[0].sides, sweep.levels[-1].sides
    print(f"\nmulti-agent, {args.max_tokens} tokens per stream, {n} streams with distinct ~1,000-token contexts")
    ratio = many["per-seq"].warm.decode_tps / many["unified"].warm.decode_tps
    print(
        f"decode tok/s at {n} streams: per-seq {many['per-seq'].warm.decode_tps:.1f}, "
        f"unified {many['unified'].warm.decode_tps:.1f} ({ratio:.2f}x)"
    )
    for layout in engines:
        gain = many[layout].warm.decode_tps / one[layout].warm.decode_tps
        cold = many[layout].cold
        together = cold.t_end - cold.t_start
        print(
            f"{layout}: {n} streams decode at {gain:.2f}x one stream; {n} cold requests together "
            f"{together:.1f} s, one after another {alone[layout]:.1f} s ({together / alone[layout]:.2f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
