"""The KV cache cleared by handing its pages back (this build) against memset (llama.cpp's own), side by side.

    python scripts/kv_clear.py --baseline-lib /path/to/unpatched/libggml-base.so [--models default,gemma3-270m-q4_k_m]

scripts/build_llama_wheel.py patches ggml's CPU buffer clear (the only change is in libggml-base.so): the
baseline is that library from a wheel built without the patch (unzip it from the wheel), loaded in place of
this build's with LD_PRELOAD. Each run is a fresh process that loads the model at `serve`'s default sizing,
computes a prompt of --prompt tokens and generates --max-tokens (greedy, speculation off); it reports the
load's time, the process's resident memory after the load and after the answer, and the prompt's and the
answer's speed. The two builds alternate within each repeat; the best of the repeats is shown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PROBE = """
import json, sys, time
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

def rss_mib():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024

model, n_prompt, n_out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
eng = make_engine(EngineConfig(spec="off", cache_ram=0, **({} if model == "default" else {"model": model})))
load_s, rss_load = time.perf_counter() - t0, rss_mib()
words = eng.vocab.tokenize(" ".join(f"item {i} is {i * 7 % 13}." for i in range(n_prompt)), add_special=False)
done = eng.generate(words[:n_prompt], SamplingParams(temperature=0, max_tokens=n_out, ignore_eos=True))
s = done.stats
cells = eng.snapshot().kv.total_cells
print(json.dumps({"load_s": load_s, "rss_load": rss_load, "rss_after": rss_mib(), "kv_cells": cells,
                  "prompt_tps": n_prompt / s.ttft_s, "decode_tps": s.decode_tps}))
eng.close()
"""


def run(model: str, preload: str | None, n_prompt: int, n_out: int) -> dict[str, float]:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    cmd = [sys.executable, "-c", PROBE, model, str(n_prompt), str(n_out)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-lib", required=True, help="libggml-base.so of a build without the patch")
    ap.add_argument("--models", default="default,gemma3-270m-q4_k_m", help="catalog names or files, comma-separated")
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    builds = {"memset (llama.cpp)": args.baseline_lib, "pages handed back (this build)": None}
    for model in args.models.split(","):
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
        for rep in range(args.repeats):
            order = list(builds) if rep % 2 == 0 else list(reversed(builds))
            for name in order:
                runs[name].append(run(model, builds[name], args.prompt, args.max_tokens))
        print(f"\n{model}: {runs[next(iter(builds))][0]['kv_cells']:,} KV cells; best of {args.repeats}")
        print(f"{'clear':<32}{'load s':>8}{'RSS loaded':>12}{'RSS after':>11}{'prompt tok/s':>14}{'decode tok/s':>14}")
        for name, rs in runs.items():
            print(
                f"{name:<32}{min(r['load_s'] for r in rs):>8.2f}{min(r['rss_load'] for r in rs):>8,} MiB"
                f"{min(r['rss_after'] for r in rs):>7,} MiB{max(r['prompt_tps'] for r in rs):>14.0f}"
                f"{max(r['decode_tps'] for r in rs):>14.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
