"""Flash attention on against off on this machine: two in-process engines taking turns, in one run.

    .venv/bin/python scripts/flash_attn.py            # multi-agent, 1 and 16 streams, 48 tokens each

The engines differ only in --flash-attn. On the CPU, llama.cpp's own auto turns flash attention
on; this is the measurement behind edgeinfer's auto choosing off there (docs/benchmarks.md, Flash attention on the CPU).
"""

from __future__ import annotations

import argparse
import sys

from edgeinfer.bench.progress import BarProgress
from edgeinfer.bench.report import print_sweep
from edgeinfer.bench.sweep import run_sweep, runs_in
from edgeinfer.bench.targets import EngineTarget, Target
from edgeinfer.bench.workloads import WORKLOADS
from edgeinfer.options import EngineConfig
from edgeinfer.runtime import make_engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="multi-agent", choices=list(WORKLOADS))
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--gpu-layers", type=int, default=0)
    args = ap.parse_args()
    n = args.streams
    base = EngineConfig(parallel=n, ctx_size=n * 2048, spec="off", gpu_layers=args.gpu_layers)
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


if __name__ == "__main__":
    sys.exit(main())
