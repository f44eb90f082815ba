"""edgeinfer against llama.cpp's llama-server: the same model, threads and context, side by side.

    python scripts/vs_llama_server.py --llama-server .llama-server/bin/llama-server

Starts llama-server and `edgeinfer serve`, each on its own Unix socket in a temporary
folder, with the same model, threads, context size, slots (--parallel) and batch sizes.
Then for each workload it runs `edgeinfer bench`'s sweep against both (the same prompts,
through the same OpenAI client, the two servers taking turns) and prints the tables:
per server, then side by side (2/1 is edgeinfer over llama-server).

Build llama-server from the llama.cpp that llama-cpp-python vendors with
scripts/build_llama_server.sh. Both servers stay up for the whole run; each is idle while
the other is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from edgeinfer.bench.progress import BarProgress
from edgeinfer.bench.report import build_report, print_sweep
from edgeinfer.bench.sweep import run_sweep, runs_in
from edgeinfer.bench.targets import ServerTarget
from edgeinfer.bench.workloads import MAX_TOKENS, WORKLOADS
from edgeinfer.models.catalog import resolve_model


def wait_healthy(sock: Path, proc: subprocess.Popen[bytes], log: Path, name: str, timeout: float = 180) -> None:
    """Poll GET /health on the socket until it answers 200; stop with the log's tail if the server dies."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"{name} exited with code {proc.returncode}; the end of its log ({log}):\n{tail(log)}")
        if sock.exists():
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=5) as http:
                    if http.get("http://server/health").status_code == 200:
                        return
            except httpx.TransportError:
                pass
        time.sleep(0.25)
    sys.exit(f"{name} did not become healthy within {timeout:.0f} s; the end of its log ({log}):\n{tail(log)}")


def tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, type=Path, help="The llama-server binary.")
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ctx-size", type=int, default=16384, help="KV cells, shared by all slots in both servers.")
    ap.add_argument("--parallel", type=int, default=16, help="Slots / streams decoded together.")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--spec", default="auto", help="edgeinfer's --spec (its default: auto).")
    ap.add_argument("--workloads", default="chat,agent")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=None, help="Per stream (default: the workload's own).")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="Write the reports (one per workload) to this file.")
    args = ap.parse_args()

    binary = args.llama_server.expanduser().resolve()
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} is not an executable; build one with scripts/build_llama_server.sh")
    workloads = args.workloads.split(",")
    if unknown := set(workloads) - set(WORKLOADS):
        sys.exit(f"unknown workload(s) {', '.join(sorted(unknown))}; use {', '.join(WORKLOADS)}")
    levels = [int(x) for x in args.concurrency.split(",")]
    if max(levels) > args.parallel:
        sys.exit(f"--concurrency {max(levels)} is above --parallel {args.parallel}: requests would queue")
    model = resolve_model(args.model)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the servers are stopped on the way out
    common = ["--threads", str(args.threads), "--threads-batch", str(args.threads), "--ctx-size", str(args.ctx_size)]
    common += ["--parallel", str(args.parallel), "--batch-size", str(args.batch_size), "--ubatch-size", "512"]

    with tempfile.TemporaryDirectory(prefix="edgeinfer-vs-") as tmp:
        folder = Path(tmp)
        llama_sock, edge_sock = folder / "llama.sock", folder / "edgeinfer.sock"
        llama_log, edge_log = folder / "llama-server.log", folder / "edgeinfer.log"
        llama_cmd = [str(binary), "--model", str(model), "--host", str(llama_sock), *common]
        llama_cmd += ["--kv-unified", "--no-webui"]
        edge_cmd = [sys.executable, "-m", "edgeinfer.cli", "serve", "--model", str(model), "--socket", str(edge_sock)]
        edge_cmd += [*common, "--spec", args.spec]
        print(f"llama-server: {' '.join(llama_cmd)}", file=sys.stderr)
        print(f"edgeinfer:    {' '.join(edge_cmd)}", file=sys.stderr)
        procs = []
        try:
            with llama_log.open("wb") as ll, edge_log.open("wb") as el:
                procs.append(subprocess.Popen(llama_cmd, stdout=ll, stderr=subprocess.STDOUT))
                procs.append(subprocess.Popen(edge_cmd, stdout=el, stderr=subprocess.STDOUT))
            wait_healthy(llama_sock, procs[0], llama_log, "llama-server")
            wait_healthy(edge_sock, procs[1], edge_log, "edgeinfer serve")
            targets = [
                ServerTarget(socket=llama_sock, name="llama-server"),
                ServerTarget(socket=edge_sock, name="edgeinfer"),
            ]
            reports = []
            for workload in workloads:
                max_tokens = args.max_tokens or MAX_TOKENS[workload]
                with BarProgress(runs_in(levels, args.repeats, len(targets))) as bar:
                    sweep = run_sweep(targets, workload, levels, max_tokens, args.repeats, bar)
                print_sweep(sweep, print)
                reports.append(json.loads(build_report(sweep).model_dump_json(by_alias=True)))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
    if args.json:
        settings = {"llama_server": llama_cmd, "edgeinfer": edge_cmd}
        args.json.write_text(json.dumps({"commands": settings, "reports": reports}, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
