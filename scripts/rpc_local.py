"""Two RPC workers on loopback, a server that uses them and the same server without: one benchmark, both.

    python scripts/rpc_local.py [--concurrency 1,16] [--max-tokens 32] [--tensor-split 1,1,1]

Starts `edgeinfer worker` twice, `edgeinfer serve --rpc` over them and a plain `edgeinfer serve`,
prints the split (`edgeinfer models --rpc`) and every process's resident memory once the model is
loaded, then runs one `edgeinfer bench --socket A --socket B` (the same workload on both, side by
side) and prints aggregate and decode tok/s at each level. On one machine the workers share its
cores with the server: the figures show what the protocol costs, not what more machines gain.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from edgeinfer.bench.results import warm_figure
from edgeinfer.errors import ConfigError
from edgeinfer.llamacpp.rpc import probe

CLI = [sys.executable, "-m", "edgeinfer.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, ready: object, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {proc.stderr.read() if proc.stderr else ''}")
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise SystemExit(f"{what} not ready in {timeout:.0f} s")


def worker_ready(port: int) -> bool:
    try:
        probe("127.0.0.1", port, timeout=2)
        return True
    except ConfigError:
        return False


def server_ready(sock: Path) -> bool:
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as c:
            return c.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def memory(names: list[str], procs: list[subprocess.Popen]) -> str:
    return ", ".join(f"{n} {rss_mib(p.pid):.0f} MiB" for n, p in zip(names, procs, strict=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tensor-split", default=None, help="as serve's --tensor-split [by free memory]")
    ap.add_argument("--worker-threads", type=int, default=0, help="each worker's --threads [all cores]")
    args = ap.parse_args(argv)
    procs: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ports = [free_port(), free_port()]
            for p in ports:
                procs.append(
                    subprocess.Popen(
                        [*CLI, "worker", "--port", str(p), "--threads", str(args.worker_threads)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
                wait_for(f"worker {p}", lambda p=p: worker_ready(p), procs[-1])
            idle = ", ".join(f"worker {i + 1} {rss_mib(p.pid):.0f} MiB" for i, p in enumerate(procs))
            print(f"resident memory, workers before any client: {idle}")
            rpc = ",".join(f"127.0.0.1:{p}" for p in ports)
            split = ["--tensor-split", args.tensor_split] if args.tensor_split else []
            print(subprocess.run([*CLI, "models", "--rpc", rpc, *split], capture_output=True, text=True).stdout)
            socks = {"with 2 workers": Path(tmp) / "rpc.sock", "local only": Path(tmp) / "local.sock"}
            parallel = str(max(int(c) for c in args.concurrency.split(",")))
            for name, sock in socks.items():
                extra = ["--rpc", rpc, *split] if name == "with 2 workers" else []
                cmd = [*CLI, "serve", "--socket", str(sock), "--parallel", parallel, "--spec", "off", *extra]
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
                wait_for(f"server {name}", lambda s=sock: server_ready(s), procs[-1])
            names = ["worker 1", "worker 2", "server with workers", "server local only"]
            print(f"resident memory, model loaded: {memory(names, procs)}")
            out = Path(tmp) / "bench.json"
            bench = [*CLI, "bench", "--concurrency", args.concurrency, "--max-tokens", str(args.max_tokens)]
            bench += ["--repeats", str(args.repeats), "--json", str(out)]
            for sock in socks.values():
                bench += ["--socket", str(sock)]
            r = subprocess.run(bench, capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"bench failed: {r.stderr[-2000:]}")
            report = json.loads(out.read_text())
            print(f"resident memory, after the benchmark: {memory(names, procs)}")
            print(f"\n{'streams':>7}  {'':16} {'aggregate tok/s':>16} {'decode tok/s':>13}")
            for name, sock in socks.items():
                total = warm_figure(report, str(sock), "aggregate_tps")
                decode = warm_figure(report, str(sock), "decode_tps")
                for c in sorted(total):
                    print(f"{c:>7}  {name:16} {total[c]:>16.1f} {decode[c]:>13.1f}")
            for c in sorted(total):
                t_rpc = warm_figure(report, str(socks["with 2 workers"]), "aggregate_tps")[c]
                t_loc = warm_figure(report, str(socks["local only"]), "aggregate_tps")[c]
                print(f"{c} streams: with workers / local only = {t_rpc / t_loc:.2f}x")
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
