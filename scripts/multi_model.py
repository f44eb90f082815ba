"""Several models on one server: time to first token for a model in memory and for one not, and memory per model.

    python scripts/multi_model.py [--model A] [--second B] [--rounds 5]

Without --second, B is a Q8_0 copy of A (`edgeinfer models quantize`, in a temporary folder).
Each server is `edgeinfer serve -m A -m B --spec off` on a Unix socket; each request a streamed chat
completion of 8 tokens at temperature 0, timed from sending it to its first token's chunk:

- loaded: B already in memory (--max-models 2);
- cold, room free: B unloaded (--idle-unload 1, and waited for), loaded on this request;
- cold, swap: --max-models 1, A in memory: A is unloaded and B loaded on this request (and back).

Memory is the server process's resident set (VmRSS) with A alone (warm), with A and B, and with A
alone again after B was unloaded (--max-models 1: A, then B, then A).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from edgeinfer.models.catalog import default_model_path, model_id_of

PROMPT = [{"role": "user", "content": "Name a planet."}]


@contextlib.contextmanager
def server(sock: Path, models: list[Path], *args: str) -> Iterator[tuple[httpx.Client, int]]:
    named = [x for m in models for x in ("-m", str(m))]
    cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "--socket", str(sock), *named, "--spec", "off", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://edgeinfer", timeout=300)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
            with contextlib.suppress(httpx.TransportError):
                if http.get("/health").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start in 120 s")
            time.sleep(0.05)
        yield http, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def ttft(http: httpx.Client, model: str) -> float:
    """Seconds from sending a streamed request to the chunk carrying its first token."""
    body = {"model": model, "messages": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    first = None
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"{model}: {r.status_code} {r.read().decode()}")
        for line in r.iter_lines():
            if first is None and line.startswith("data:") and line[5:].strip() != "[DONE]":
                choices = json.loads(line[5:])["choices"]
                if choices and choices[0]["delta"].get("content"):
                    first = time.perf_counter() - t0
    assert first is not None, "no token came"
    return first


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    kib = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
    return kib / 1024


def status_of(http: httpx.Client) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in http.get("/v1/models").json()["data"]}


def wait_unloaded(http: httpx.Client, model: str) -> None:
    while status_of(http)[model]:
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=default_model_path(), help="model A, the default")
    ap.add_argument("--second", type=Path, default=None, help="model B [default: a Q8_0 copy of A]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        b_path = args.second
        if b_path is None:
            b_path = work / f"{model_id_of(args.model)}-Q8_0.gguf"
            quantize = [sys.executable, "-m", "edgeinfer.cli", "models", "quantize", str(args.model), str(b_path)]
            subprocess.run([*quantize, "Q8_0"], check=True, capture_output=True)
        a, b = model_id_of(args.model), model_id_of(b_path)
        models = [args.model, b_path]
        figures: dict[str, object] = {"model_a": a, "model_b": b, "rounds": args.rounds}
        figures["file_mib"] = {a: args.model.stat().st_size / 2**20, b: b_path.stat().st_size / 2**20}

        with server(work / "two.sock", models, "--max-models", "2") as (http, pid):
            ttft(http, a)
            figures["rss_a_mib"] = rss_mib(pid)
            ttft(http, b)
            ttft(http, b)
            figures["rss_ab_mib"] = rss_mib(pid)
            figures["ttft_loaded_s"] = [ttft(http, b) for _ in range(args.rounds)]

        with server(work / "idle.sock", models, "--max-models", "2", "--idle-unload", "1") as (http, pid):
            cold = []
            for _ in range(args.rounds):
                wait_unloaded(http, b)
                cold.append(ttft(http, b))
            figures["ttft_cold_room_s"] = cold

        with server(work / "swap.sock", models, "--max-models", "1") as (http, pid):
            ttft(http, a)
            figures["rss_a_alone_mib"] = rss_mib(pid)
            swaps = []
            for _ in range(args.rounds):
                swaps.append(ttft(http, b))  # a out, b in
                ttft(http, a)  # b out, a in
            assert status_of(http) == {a: True, b: False}
            figures["rss_a_after_unload_mib"] = rss_mib(pid)
            figures["ttft_cold_swap_s"] = swaps

    if args.json:
        print(json.dumps(figures, indent=2))
        return
    med = lambda xs: statistics.median(xs) * 1000  # noqa: E731
    size: dict[str, float] = figures["file_mib"]  # type: ignore[assignment]
    print(f"A = {a} ({size[a]:.0f} MiB file), B = {b} ({size[b]:.0f} MiB file)")
    print(f"time to first token of B, median of {args.rounds}:")
    print(f"  loaded                        {med(figures['ttft_loaded_s']):8.0f} ms")  # type: ignore[arg-type]
    print(f"  unloaded, room free           {med(figures['ttft_cold_room_s']):8.0f} ms")  # type: ignore[arg-type]
    print(f"  unloaded, swapped for A       {med(figures['ttft_cold_swap_s']):8.0f} ms")  # type: ignore[arg-type]
    print("server RSS:")
    print(f"  A loaded                      {figures['rss_a_mib']:8.0f} MiB")
    print(f"  A and B loaded                {figures['rss_ab_mib']:8.0f} MiB")
    print(f"  A alone (--max-models 1)      {figures['rss_a_alone_mib']:8.0f} MiB")
    print(f"  A again after B unloaded      {figures['rss_a_after_unload_mib']:8.0f} MiB")


if __name__ == "__main__":
    main()
