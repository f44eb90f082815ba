"""Flash attention on against off on this machine: two in-process engines taking turns, in one run.

    .venv/bin/python scripts/flash_attn.py            # multi-agent, 1 and 16 streams, 48 tokens each
    .venv/bin/python scripts/flash_attn.py --model gemma3-270m-q4_k_m --lengths 4096,12288   # one long prompt

With --lengths: one stream, a fresh prompt of each length (token ids of edgeinfer's own source, never
cached), then 64 greedy tokens; the prompt's tokens/s and the decode's, the two settings alternating in
each of --repeats repeats, the best shown.

The engines differ only in --flash-attn. On the CPU, llama.cpp's own auto turns flash attention
on; this is the measurement behind edgeinfer's auto choosing off there (docs/benchmarks.md, Flash attention on the CPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgeinfer.bench.progress import BarProgress
from edgeinfer.bench.report import print_sweep
from edgeinfer.bench.sweep import run_sweep, runs_in
from edgeinfer.bench.targets import EngineTarget, Target
from edgeinfer.bench.workloads import WORKLOADS
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="multi-agent", choices=list(WORKLOADS))
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: the default model)")
    ap.add_argument("--lengths", default=None, help="one stream: prompt lengths in tokens, comma-separated")
    ap.add_argument("--repeats", type=int, default=3, help="with --lengths")
    args = ap.parse_args()
    if args.lengths:
        return long_prompts(args)
    n = args.streams
    base = EngineConfig(parallel=n, ctx_size=n * 2048, spec="off", gpu_layers=args.gpu_layers, model=args.model)
    engines = {fa: make_engine(base.replace(flash_attn=fa)) for fa in ("on", "off")}
    try:
        targets: list[Target] = [EngineTarget(e, f"flash attention {fa}") for fa, e in engines.items()]
        with BarProgress(runs_in([1, n], 1, len(targets))) as bar:
            sweep = run_sweep(targets, args.workload, [1, n], args.max_tokens, 1, bar)
        print_sweep(sweep, print)
    finally:
        for e in engines.values():
            e.close()
    return 0


def long_prompts(args: argparse.Namespace) -> int:
    lengths = [int(x) for x in args.lengths.split(",")]
    base = EngineConfig(
        model=args.model, parallel=1, ctx_size=max(lengths) + 128, spec="off", cache_ram=0, gpu_layers=args.gpu_layers
    )
    source = "".join(p.read_text() for p in sorted(Path(__file__).resolve().parents[1].glob("edgeinfer/**/*.py")))
    best: dict[tuple[int, str], tuple[float, float]] = {}
    engines = {fa: make_engine(base.replace(flash_attn=fa)) for fa in ("on", "off")}
    try:
        ids = engines["on"].vocab.tokenize(source, add_special=False)
        for rep in range(args.repeats):
            for n in lengths:
                start = (7919 * rep + n) % (len(ids) - n)  # a new prompt each time: nothing cached
                for fa in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
                    s = engines[fa].generate(ids[start : start + n], params).stats
                    prompt_tps, decode_tps = n / (s.ttft_s or 1), s.decode_tps or 0.0
                    print(f"repeat {rep + 1}, {n} tokens, flash attention {fa}: prompt {prompt_tps:.0f} tok/s, "
                          f"decode {decode_tps:.1f} tok/s", flush=True)  # fmt: skip
                    was = best.get((n, fa), (0.0, 0.0))
                    best[(n, fa)] = (max(was[0], prompt_tps), max(was[1], decode_tps))
    finally:
        for e in engines.values():
            e.close()
    print(f"\nbest of {args.repeats}: prompt tok/s and decode tok/s after it (on / off)")
    for n in lengths:
        (p_on, d_on), (p_off, d_off) = best[(n, "on")], best[(n, "off")]
        print(f"{n:>6} tokens: prompt {p_on:.0f} / {p_off:.0f} ({p_on / p_off:.2f}x), "
              f"decode {d_on:.1f} / {d_off:.1f} ({d_on / d_off:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
