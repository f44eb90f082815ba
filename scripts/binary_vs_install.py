"""The one-file build against the virtualenv install, side by side on this machine.

    python scripts/binary_vs_install.py [--binary dist/edgeinfer] [--rounds 2]

Prints the binary's size; start-up to the first token (`generate --max-tokens 1`, wall clock
from exec to exit) for the binary's first start (it unpacks), its later starts and the
install; and decode tok/s of `bench --concurrency 1,16` for both, alternating, each in an
empty environment with a temporary HOME.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgeinfer.bench.results import warm_figure

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], home: Path) -> float:
    t0 = time.perf_counter()
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(cmd, env=env, cwd=home, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {r.stderr[-2000:]}")
    return time.perf_counter() - t0


def decode_tps(cmd: list[str], home: Path, out: Path) -> dict[int, float]:
    timed([*cmd, "bench", "--concurrency", "1,16", "--max-tokens", "64", "--json", str(out)], home)
    return warm_figure(json.loads(out.read_text()), "edgeinfer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, default=ROOT / "dist" / "edgeinfer")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of each measurement [2]")
    args = ap.parse_args(argv)
    binary = [str(args.binary.resolve())]
    install = [sys.executable, "-m", "edgeinfer.cli"]
    first = [*binary, "generate", "--max-tokens", "1", "Hi"]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        cold, warm, inst = [], [], []
        for r in range(args.rounds):
            fresh = home / f"cold{r}"
            fresh.mkdir()
            cold.append(timed(first, fresh))
            warm.append(timed(first, fresh))
            inst.append(timed([*install, *first[1:]], fresh))
        tps: dict[str, dict[int, list[float]]] = {"binary": {1: [], 16: []}, "install": {1: [], 16: []}}
        for _ in range(args.rounds):
            for name, cmd in (("binary", binary), ("install", install)):
                for c, v in decode_tps(cmd, home / "cold0", home / f"{name}.json").items():
                    tps[name][c].append(v)
    print(f"{args.binary}: {args.binary.stat().st_size / 2**20:.0f} MiB")
    med = statistics.median
    print(f"start-up to first token: binary first start {med(cold):.2f} s, later starts {med(warm):.2f} s, ", end="")
    print(f"install {med(inst):.2f} s (median of {args.rounds})")
    for c in (1, 16):
        b, i = med(tps["binary"][c]), med(tps["install"][c])
        print(f"decode tok/s at {c:>2} streams: binary {b:.1f}, install {i:.1f}, binary/install {b / i:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
