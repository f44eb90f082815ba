"""The portable llama.cpp build (the default on Linux) against a -march=native one, side by side.

    python scripts/build_llama_wheel.py --package llama-cpp-python==0.3.36 --out /tmp/native
    python scripts/portable_vs_native.py --native-wheel /tmp/native/llama_cpp_python-*.whl

Runs `edgeinfer bench --concurrency 1,16` with the virtualenv's llama.cpp (portable) and with
the native wheel's libraries (through LLAMA_CPP_LIB_PATH: same Python, other llama.cpp),
alternating, the order swapped every round, and prints warm decode tok/s medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from edgeinfer.bench.results import warm_figure

LEVELS = (1, 16)


def bench(lib: Path | None, out: Path, max_tokens: int) -> dict[int, float]:
    env = dict(os.environ)
    if lib is not None:
        env["LLAMA_CPP_LIB_PATH"] = str(lib)
    cmd = [sys.executable, "-m", "edgeinfer.cli", "bench", "--concurrency", ",".join(map(str, LEVELS))]
    cmd += ["--max-tokens", str(max_tokens), "--json", str(out)]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return warm_figure(json.loads(out.read_text()), "edgeinfer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--native-wheel", type=Path, required=True, help="a llama-cpp-python wheel built with native flags")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(args.native_wheel) as wheel:
            wheel.extractall(tmp)
        native_lib = Path(tmp) / "llama_cpp" / "lib"
        for f in native_lib.iterdir():
            f.chmod(0o755)
        got: dict[str, dict[int, list[float]]] = {
            "portable": {c: [] for c in LEVELS},
            "native": {c: [] for c in LEVELS},
        }
        for r in range(args.rounds):
            order = [("portable", None), ("native", native_lib)]
            for name, lib in order if r % 2 == 0 else order[::-1]:
                for c, v in bench(lib, Path(tmp) / "bench.json", args.max_tokens).items():
                    got[name][c].append(v)
                print(f"round {r + 1} {name}: " + ", ".join(f"{c}: {got[name][c][-1]:.1f}" for c in LEVELS), flush=True)
    med = statistics.median
    for c in LEVELS:
        p, n = med(got["portable"][c]), med(got["native"][c])
        print(f"decode tok/s at {c:>2} streams: portable {p:.1f}, native {n:.1f}, portable/native {p / n:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
