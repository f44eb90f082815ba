"""Two engines in one process (several models served): each one's decode rate before and after the other has run.

    .venv/bin/python scripts/two_engines.py

Each engine's thread gets a team of OpenMP threads for llama.cpp, and libgomp spins much less
once a process holds more of its threads than there are cores. For each setting (libgomp's own
defaults, and OMP_WAIT_POLICY=ACTIVE with libgomp's default spin count: 1,000 spins where it
throttles instead of 100) a fresh process makes two engines of the model and has them answer
in turn (A, A, B, A, B, ...: a fresh prompt of --prompt tokens, --max-tokens greedy tokens
each) and prints each answer's decode tok/s. The first two answers are A's alone.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from edgeinfer.openmp import SPINNING  # what `serve` of several models sets (it imports nothing of llama.cpp)

SETTINGS = {
    "libgomp's defaults": {},
    " ".join(f"{key}={value}" for key, value in SPINNING.items()): SPINNING,
}


def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from one_stream import prompt_ids

    from edgeinfer.models.catalog import resolve_model
    from edgeinfer.options import EngineConfig, SamplingParams
    from edgeinfer.runtime import make_engine

    config = EngineConfig(model=resolve_model(args.model), parallel=4, ctx_size=16384, flash_attn="off", spec="off")
    engines = {"A": make_engine(config), "B": make_engine(config)}
    try:
        words = engines["A"].vocab
        rates = []
        for i, name in enumerate(args.order.split(",")):
            prompt = prompt_ids(args.prompt, 100 + i, lambda text: words.tokenize(text, add_special=False))
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
            (handle,) = engines[name].submit(prompt, params)
            rates.append(f"{name} {handle.result().stats.decode_tps:5.1f}")
        print("  ".join(rates), flush=True)
    finally:
        for engine in engines.values():
            engine.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--order", default="A,A,B,A,B,A,B", help="Which engine answers, in turn.")
    ap.add_argument("--prompt", type=int, default=256, help="Prompt tokens of each answer.")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="Processes per setting, taking turns.")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    own = [a for a in sys.argv[1:] if a != "--child"]
    for rep in range(args.repeats):
        for name, env in SETTINGS.items():
            print(f"repeat {rep + 1}, {name}: decode tok/s of each answer", flush=True)
            base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            done = subprocess.run(
                [sys.executable, __file__, *own, "--child"], env=base | env, stdout=subprocess.PIPE, text=True
            )
            print("  " + (done.stdout.strip() or f"(failed with code {done.returncode})"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
