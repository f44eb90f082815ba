"""CPU time per streamed token, thread by thread, of `edgeinfer serve` (and llama-server): what serving costs.

    .venv/bin/python scripts/server_cpu.py --llama-server ~/.cache/edgeinfer/llama-server/bin/llama-server

Each server runs alone (the other stopped), with the same flags as scripts/vs_llama_server.py.
After one warm-up answer, --answers streamed answers of a workload's first stream (greedy,
`ignore_eos`, one at a time, as scripts/itl_gaps.py sends them) go through its Unix socket,
and each thread's user + system time (/proc/PID/task/TID/stat) before and after gives its
CPU milliseconds per token. On a 2-core machine with llama.cpp on both cores, whatever
another thread runs (edgeinfer's asyncio loop, llama-server's HTTP threads) is time a
llama.cpp thread waits for its core.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from itl_gaps import gaps_of
from one_stream import workload_turn
from vs_llama_server import llama_server_command, running_servers, server_flags

from edgeinfer.bench.workloads import WORKLOADS
from edgeinfer.models.catalog import resolve_model

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, tuple[str, float, int]]:
    """Each live thread of pid: its name, its user + system CPU seconds so far, and how often it has slept
    (voluntary context switches: waiting for a wake-up, the GIL, I/O)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:
            continue
        sleeps = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) * TICK_S, sleeps)  # utime, stime
    return out


def measure(name: str, proc: subprocess.Popen[bytes], sock: Path, body: dict[str, object], answers: int) -> None:
    gaps_of(sock, body)  # warm: the prompt cached, every lazy start done
    before = thread_cpu(proc.pid)
    start = time.perf_counter()
    tokens = sum(len(gaps_of(sock, body)) + 1 for _ in range(answers))
    wall = time.perf_counter() - start
    after = thread_cpu(proc.pid)
    rows = []
    for tid, (comm, cpu, sleeps) in after.items():
        _, cpu0, sleeps0 = before.get(tid, (comm, 0.0, 0))
        if cpu > cpu0:
            role = "main" if tid == proc.pid else "new" if tid not in before else ""
            rows.append((cpu - cpu0, tid, comm, (sleeps - sleeps0) / tokens, role))
    total = sum(r[0] for r in rows)
    print(f"\n{name}: {tokens} tokens in {wall:.1f} s ({1000 * wall / tokens:.2f} ms a token of wall time)")
    print(f"  {'thread':>8} {'name':<16} {'ms/token':>9} {'sleeps/token':>12}")
    for used, tid, comm, sleeps, role in sorted(rows, reverse=True):
        print(f"  {tid:>8} {comm:<16} {1000 * used / tokens:>9.3f} {sleeps:>12.2f} {role}")
    print(f"  {'all':>8} {'':<16} {1000 * total / tokens:>9.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", type=Path, default=None, help="Also measure this llama-server binary.")
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--workload", default="chat", choices=WORKLOADS)
    ap.add_argument("--max-tokens", type=int, default=None, help="Default: the workload's own.")
    ap.add_argument("--answers", type=int, default=21)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--spec", default="auto", help="edgeinfer's --spec.")
    ap.add_argument("--edgeinfer-args", default="", help="More flags for `edgeinfer serve`.")
    args = ap.parse_args()
    model = resolve_model(args.model)
    flags = server_flags(args.threads)
    body = workload_turn(args.workload, args.max_tokens)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))  # so the server is stopped on the way out
    with tempfile.TemporaryDirectory(prefix="edgeinfer-cpu-") as tmp:
        folder = Path(tmp)
        sock = folder / "server.sock"
        edgeinfer = [sys.executable, "-m", "edgeinfer.cli", "serve", "--model", str(model), "--socket", str(sock)]
        commands = {"edgeinfer": [*edgeinfer, *flags, "--spec", args.spec, *args.edgeinfer_args.split()]}
        if args.llama_server:
            commands["llama-server --kv-unified"] = [
                *llama_server_command(args.llama_server.expanduser(), model, flags, sock),
                "--kv-unified",
            ]
        for name, cmd in commands.items():
            print(f"{name}: {' '.join(cmd)}", file=sys.stderr)
            with running_servers({name: cmd}, {name: sock}, folder) as procs:
                measure(name, procs[0], sock, body, args.answers)
            sock.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
