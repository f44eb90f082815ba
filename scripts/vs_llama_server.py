"""edgeinfer against llama.cpp's llama-server: the same model, threads and context, side by side.

    python scripts/vs_llama_server.py --llama-server .llama-server/bin/llama-server

Starts llama-server twice (with --kv-unified, and with its default of one KV stream per
slot) and `edgeinfer serve`, each on its own Unix socket in a temporary folder, with the
same model, threads, context size, slots (--parallel) and batch sizes. Then for each
workload it runs `edgeinfer bench`'s sweep against all three (the same prompts, through the
same OpenAI client, the servers taking turns) and prints the tables: per server, then side
by side (k/1 is each server over the first).

Build llama-server from the llama.cpp that llama-cpp-python vendors with
scripts/build_llama_server.sh. The servers stay up for the whole run; each is idle while
another is measured.
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
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def running_servers(
    commands: dict[str, list[str]], sockets: dict[str, Path], folder: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Start each server (its output logged in folder), wait until each is healthy; stop them all on the way out.
    Yields their processes, in the order of commands."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, cmd in commands.items():
            log = folder / f"{name.replace(' ', '_')}.log"
            with log.open("wb") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
            wait_healthy(sockets[name], procs[-1], log, name)
        yield procs
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def server_flags(
    threads: int, ctx_size: int = 32768, parallel: int = 16, batch_size: int = 512, flash_attn: str = "off"
) -> list[str]:
    """The settings every server in a comparison gets (edgeinfer serve and llama-server take the same flags)."""
    flags = ["--threads", str(threads), "--threads-batch", str(threads), "--ctx-size", str(ctx_size)]
    flags += ["--parallel", str(parallel), "--batch-size", str(batch_size), "--ubatch-size", "512"]
    return [*flags, "--flash-attn", flash_attn]


def llama_server_command(binary: Path | str, model: Path | str, flags: list[str], socket: Path) -> list[str]:
    """llama-server's command line in a comparison: the common flags, no web UI, listening on a Unix socket."""
    return [str(binary), "--model", str(model), *flags, "--no-webui", "--host", str(socket)]


def workloads_of(text: str) -> list[str]:
    """--workloads, checked against the bench's."""
    workloads = text.split(",")
    if unknown := set(workloads) - set(WORKLOADS):
        sys.exit(f"unknown workload(s) {', '.join(sorted(unknown))}; use {', '.join(WORKLOADS)}")
    return workloads


def levels_of(text: str, parallel: int) -> list[int]:
    """--concurrency, checked against the servers' slots."""
    levels = [int(x) for x in text.split(",")]
    if max(levels) > parallel:
        sys.exit(f"--concurrency {max(levels)} is above --parallel {parallel}: requests would queue")
    return levels


def tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, type=Path, help="The llama-server binary.")
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--ctx-size", type=int, default=32768, help="KV cells in each server (per slot: this / --parallel)."
    )
    ap.add_argument("--parallel", type=int, default=16, help="Slots / streams decoded together.")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument(
        "--flash-attn",
        default="off",
        choices=["on", "off", "auto"],
        help="Passed to all three: matching settings (edgeinfer's auto is off on the CPU, llama-server's is on).",
    )
    ap.add_argument("--spec", default="auto", help="edgeinfer's --spec (its default: auto).")
    ap.add_argument("--workloads", default="chat,agent,multi-agent")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=None, help="Per stream (default: the workload's own).")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="Write the reports (one per workload) to this file.")
    args = ap.parse_args()

    binary = args.llama_server.expanduser().resolve()
    if not os.access(binary, os.X_OK):
        sys.exit(f"{binary} is not an executable; build one with scripts/build_llama_server.sh")
    workloads = workloads_of(args.workloads)
    levels = levels_of(args.concurrency, args.parallel)
    model = resolve_model(args.model)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the servers are stopped on the way out
    common = server_flags(args.threads, args.ctx_size, args.parallel, args.batch_size, args.flash_attn)

    with tempfile.TemporaryDirectory(prefix="edgeinfer-vs-") as tmp:
        folder = Path(tmp)
        # llama-server twice: one unified KV cache, and one KV stream per slot (its default with
        # --parallel); the better of the two is the bar.
        unified_sock, slots_sock = folder / "llama-unified.sock", folder / "llama-slots.sock"
        edge_sock = folder / "edgeinfer.sock"
        commands = {
            "llama-server --kv-unified": [*llama_server_command(binary, model, common, unified_sock), "--kv-unified"],
            "llama-server": llama_server_command(binary, model, common, slots_sock),
            "edgeinfer": [
                *[sys.executable, "-m", "edgeinfer.cli", "serve", "--model", str(model), "--socket", str(edge_sock)],
                *[*common, "--spec", args.spec],
            ],
        }
        sockets = {"llama-server --kv-unified": unified_sock, "llama-server": slots_sock, "edgeinfer": edge_sock}
        for name, cmd in commands.items():
            print(f"{name}: {' '.join(cmd)}", file=sys.stderr)
        with running_servers(commands, sockets, folder):
            targets = [ServerTarget(socket=sock, name=name) for name, sock in sockets.items()]
            reports = []
            for workload in workloads:
                max_tokens = args.max_tokens or MAX_TOKENS[workload]
                with BarProgress(runs_in(levels, args.repeats, len(targets))) as bar:
                    sweep = run_sweep(targets, workload, levels, max_tokens, args.repeats, bar)
                print_sweep(sweep, print)
                reports.append(json.loads(build_report(sweep).model_dump_json(by_alias=True)))
    if args.json:
        args.json.write_text(json.dumps({"commands": commands, "reports": reports}, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
