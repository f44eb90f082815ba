"""Pull throughput: `edgeinfer pull` against `hf download` (huggingface_hub's own CLI) on one loopback fake Hub.

Each run starts from an empty cache (its own HF_HOME) and times the whole command, start-up and the GGUF
check included, as a user waits for it; the two tools alternate, best of --runs each. Also times each
command on a cached file (start-up and the cache look-up: no request).

    .venv/bin/python scripts/pull_speed.py                # the default model (98 MB)
    .venv/bin/python scripts/pull_speed.py --size-mb 1000  # a 1 GB GGUF written for the run
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fakehub import FakeHub  # noqa: E402

from edgeinfer.models.catalog import default_model_path  # noqa: E402

BIN = Path(sys.executable).parent
REPO = "bench/speed-GGUF"
FILE = "speed-Q4_1.gguf"


def payload(size_mb: int, folder: Path) -> bytes:
    """The default model's bytes, or a valid GGUF of about size_mb MB (one F32 tensor)."""
    if not size_mb:
        return default_model_path().read_bytes()
    path = folder / "big.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_tensor("blk.0.w", np.arange(size_mb * 1_000_000 // 4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    path.unlink()
    return data


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=0, help="GGUF size to serve (0: the default model)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tools = {
        "edgeinfer pull": [str(BIN / "edgeinfer"), "pull", f"{REPO}:Q4_1"],
        "hf download": [str(BIN / "hf"), "download", REPO, FILE],
    }
    with tempfile.TemporaryDirectory() as tmp, FakeHub() as hub:
        data = payload(args.size_mb, Path(tmp))
        hub.add(REPO, {FILE: data})
        base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }
        best = dict.fromkeys(tools, float("inf"))
        cached = dict.fromkeys(tools, float("inf"))
        for run in range(args.runs):
            for name, cmd in tools.items():
                home = Path(tmp) / f"home-{run}-{name.split()[0]}"
                env = base | {"HF_HOME": str(home)}
                best[name] = min(best[name], timed(cmd, env))
                cached[name] = min(cached[name], timed(cmd, env))
                got = next(home.rglob(f"snapshots/*/{FILE}"))
                assert got.stat().st_size == len(data), f"{name} left a file of the wrong size"
                subprocess.run(["rm", "-rf", str(home)], check=True)
    mb = len(data) / 1e6
    print(f"{mb:.0f} MB GGUF from a loopback fake Hub, whole command, best of {args.runs}, fresh cache each run")
    for name in tools:
        print(f"  {name:15s} {mb / best[name]:7.1f} MB/s  ({best[name]:.2f} s; cached: {cached[name]:.2f} s)")
    ratio = best["hf download"] / best["edgeinfer pull"]
    print(f"  edgeinfer pull / hf download: {ratio:.2f}x")


if __name__ == "__main__":
    main()
