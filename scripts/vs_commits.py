"""Two or more edgeinfer checkouts side by side, beside llama-server: did a change move a level?

    git worktree add /tmp/before HEAD~1
    .venv/bin/python scripts/vs_commits.py --llama-server .llama-server/bin/llama-server \\
        before=/tmp/before after=. --workloads chat --concurrency 4 --repeats 6

Each NAME=TREE starts `edgeinfer serve` from that source tree (run inside it, so its own
`edgeinfer` package is imported; this venv's dependencies), with vs_llama_server.py's settings,
beside one llama-server (a KV stream per slot, its default with --parallel). The servers take
turns through `edgeinfer bench`'s sweep (best of --repeats), as in vs_llama_server.py.
--parallel and --ctx-size change the servers' shape (serve's own default: 8 slots of 8,192 cells).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from vs_llama_server import levels_of, llama_server_command, running_servers, server_flags, workloads_of

from edgeinfer.bench.progress import BarProgress
from edgeinfer.bench.report import print_sweep
from edgeinfer.bench.sweep import run_sweep, runs_in
from edgeinfer.bench.targets import ServerTarget
from edgeinfer.bench.workloads import MAX_TOKENS
from edgeinfer.models.catalog import resolve_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", metavar="NAME=TREE", help="A name and an edgeinfer source tree.")
    ap.add_argument("--llama-server", type=Path, default=None, help="The llama-server binary (none: edgeinfer only).")
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workloads", default="chat")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=16, help="Slots in each server (vs_llama_server.py's 16).")
    ap.add_argument("--ctx-size", type=int, default=32768, help="KV cells in each server (per slot: / --parallel).")
    args = ap.parse_args()

    trees = {}
    for arg in args.trees:
        name, sep, tree = arg.partition("=")
        if not sep or not (Path(tree) / "edgeinfer" / "__init__.py").is_file():
            sys.exit(f"{arg!r}: give NAME=TREE, TREE a checkout with an edgeinfer/ package")
        trees[name] = Path(tree).resolve()
    workloads = workloads_of(args.workloads)
    levels = levels_of(args.concurrency, args.parallel)
    model = str(resolve_model(args.model))
    common = server_flags(args.threads, ctx_size=args.ctx_size, parallel=args.parallel)

    with tempfile.TemporaryDirectory(prefix="edgeinfer-commits-") as tmp:
        folder = Path(tmp)
        commands: dict[str, list[str]] = {}
        sockets: dict[str, Path] = {}
        if args.llama_server is not None:
            sockets["llama-server"] = folder / "llama-server.sock"
            binary = args.llama_server.expanduser().resolve()
            commands["llama-server"] = llama_server_command(binary, model, common, sockets["llama-server"])
        for name, tree in trees.items():
            sockets[name] = folder / f"{name}.sock"
            commands[name] = ["env", f"--chdir={tree}", sys.executable, "-m", "edgeinfer.cli", "serve"]
            commands[name] += ["--model", model, "--socket", str(sockets[name]), *common]
        for name, cmd in commands.items():
            print(f"{name}: {' '.join(cmd)}", file=sys.stderr)
        with running_servers(commands, sockets, folder):
            targets = [ServerTarget(socket=sock, name=name) for name, sock in sockets.items()]
            for workload in workloads:
                with BarProgress(runs_in(levels, args.repeats, len(targets))) as bar:
                    sweep = run_sweep(targets, workload, levels, MAX_TOKENS[workload], args.repeats, bar)
                print_sweep(sweep, print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
