"""Every llama_decode call of llama-server and edgeinfer serve under the same load: where a level's time goes.

    .venv/bin/python scripts/decode_calls.py --llama-server ~/.cache/edgeinfer/llama-server/bin/llama-server \\
        --workload multi-agent --concurrency 16 --repeats 3

Starts llama-server (one KV stream per slot, vs_llama_server.py's settings) with a small shim preloaded
(compiled here with `cc`) that times each `llama_process` call and counts the tokens and sequence runs
added to its batch, and `edgeinfer serve` with `Context.decode` timed the same way; runs `edgeinfer
bench --socket` on both, taking turns; then prints, for each server, its calls by kind (a decode step of
one token for every slot, smaller decode steps, prompt chunks, steps mixing prompts or drafts with
decoding) with their median time, each server's turns (time, time inside llama.cpp, tokens), and how
each warm run began (its first calls and the gaps between them, where a burst of requests lands).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from vs_llama_server import levels_of, llama_server_command, running_servers, server_flags

from edgeinfer.models.catalog import resolve_model

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static FILE *out;
static int n_tok, n_runs, last_seq = -1;
static void note(int32_t seq) { n_tok++; if (seq != last_seq) { n_runs++; last_seq = seq; } }
void llama_batch_ext_clear(void *b) {
  static void (*f)(void *); if (!f) f = dlsym(RTLD_NEXT, "llama_batch_ext_clear");
  n_tok = n_runs = 0; last_seq = -1; f(b);
}
int32_t llama_batch_ext_add(void *b, int32_t s) {
  static int32_t (*f)(void *, int32_t); if (!f) f = dlsym(RTLD_NEXT, "llama_batch_ext_add");
  note(s); return f(b, s);
}
int32_t llama_batch_ext_add_token(void *b, int32_t s, int32_t t) {
  static int32_t (*f)(void *, int32_t, int32_t); if (!f) f = dlsym(RTLD_NEXT, "llama_batch_ext_add_token");
  note(s); return f(b, s, t);
}
int32_t llama_process(void *ctx, int type, void *b) {
  static int32_t (*f)(void *, int, void *);
  if (!f) {
    f = dlsym(RTLD_NEXT, "llama_process");
    out = fopen(getenv("DECODE_LOG"), "w");
    setvbuf(out, NULL, _IOLBF, 0);
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int32_t r = f(ctx, type, b);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  fprintf(out, "%d %d %.6f %.6f\n", n_tok, n_runs, t0.tv_sec + t0.tv_nsec * 1e-9,
          (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9);
  return r;
}
"""

Call = tuple[int, int, float, float]  # tokens, runs of one sequence id, start, seconds


def serve_logged(log: str, argv: list[str]) -> None:
    """`edgeinfer serve` (argv) with every Context.decode logged as the shim logs llama-server's calls."""
    from edgeinfer.cli import main as cli
    from edgeinfer.llamacpp import core

    out = open(log, "w", buffering=1)  # noqa: SIM115 - open for the server's life
    decode = core.Context.decode

    def logged(self: core.Context, batch: core.Batch) -> bool:
        runs, last = 0, -1
        for r in range(batch.n):
            if (s := batch._seq[r][0]) != last:
                runs, last = runs + 1, s
        t0 = time.perf_counter()
        try:
            return decode(self, batch)
        finally:
            out.write(f"{batch.n} {runs} {t0:.6f} {time.perf_counter() - t0:.6f}\n")

    core.Context.decode = logged  # type: ignore[method-assign]
    sys.argv = ["edgeinfer", *argv]
    cli()


def load(path: Path) -> list[Call]:
    calls = []
    for line in path.read_text().splitlines():
        n, runs, t0, dt = line.split()
        calls.append((int(n), int(runs), float(t0), float(dt)))
    return calls


def kind(call: Call, streams: int) -> str:
    n, runs = call[0], call[1]
    if n == runs:
        return f"decode, {streams} streams" if n == streams else "decode, fewer streams"
    return "prompt chunk" if n > 8 * runs else "prompt or drafts with decoding"


def gap(a: Call, b: Call) -> float:
    """Seconds from the end of call a to the start of call b."""
    return b[2] - a[2] - a[3]


def turns(calls: list[Call], pause: float) -> list[list[Call]]:
    """Split at pauses longer than `pause` seconds (the other server's turn)."""
    out: list[list[Call]] = [calls[:1]]
    for prev, c in itertools.pairwise(calls):
        if gap(prev, c) > pause:
            out.append([])
        out[-1].append(c)
    return [t for t in out if len(t) > 4]


def report(name: str, calls: list[Call], streams: int) -> None:
    in_llama = sum(c[3] for c in calls)
    print(f"\n{name}: {len(calls)} calls, {sum(c[0] for c in calls)} tokens, {in_llama:.1f} s in llama.cpp")
    by: dict[str, list[float]] = defaultdict(list)
    for c in calls:
        by[kind(c, streams)].append(c[3])
    for what, v in sorted(by.items()):
        print(f"  {what:32s} {len(v):5d} calls, median {1e3 * statistics.median(v):7.1f} ms, in all {sum(v):6.1f} s")
    gaps = [gap(a, b) for a, b in itertools.pairwise(calls)]
    inside = [g for g in gaps if g < 0.05]
    print(f"  between calls in a run: median {1e3 * statistics.median(inside):.1f} ms, in all {sum(inside):.2f} s")
    for t in turns(calls, 10.0):
        span = t[-1][2] + t[-1][3] - t[0][2]
        print(f"  turn: {span:.1f} s, {sum(c[3] for c in t):.1f} s in llama.cpp, {sum(c[0] for c in t)} tokens")
        # A turn is a cold run, then a warm run after the client's pause (the longest gap past the turn's first
        # quarter: a cold run's own start can pause longer, while kept conversations are saved); how it began.
        quarter = t[0][2] + (t[-1][2] - t[0][2]) / 4
        later = [i for i in range(1, len(t)) if t[i][2] > quarter] or [1]
        k = max(later, key=lambda i: gap(t[i - 1], t[i]))
        head = t[k : k + 4]
        calls_s = "  ".join(f"{c[0]} tokens/{c[1]} runs {1e3 * c[3]:.0f} ms" for c in head)
        gaps_s = " ".join(f"{1e3 * gap(a, b):.0f}" for a, b in itertools.pairwise(head))
        print(f"    warm run began: {calls_s}; gaps {gaps_s} ms")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "_serve":
        serve_logged(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", type=Path, required=True, help="The llama-server binary.")
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--workload", default="multi-agent")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=16)
    ap.add_argument("--ctx-size", type=int, default=32768)
    args = ap.parse_args()
    levels_of(str(args.concurrency), args.parallel)  # exits where requests would queue
    model = str(resolve_model(args.model))
    common = server_flags(args.threads, ctx_size=args.ctx_size, parallel=args.parallel)

    with tempfile.TemporaryDirectory(prefix="edgeinfer-calls-") as tmp:
        folder = Path(tmp)
        shim = folder / "shim.so"
        (folder / "shim.c").write_text(SHIM)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", shim, folder / "shim.c", "-ldl"], check=True)
        logs = {"llama-server": folder / "llama-server.calls", "edgeinfer": folder / "edgeinfer.calls"}
        sockets = {"llama-server": folder / "llama.sock", "edgeinfer": folder / "edgeinfer.sock"}
        commands = {
            "llama-server": [
                *["env", f"DECODE_LOG={logs['llama-server']}", f"LD_PRELOAD={shim}"],
                *llama_server_command(args.llama_server, model, common, sockets["llama-server"]),
            ],
            "edgeinfer": [
                *[sys.executable, __file__, "_serve", str(logs["edgeinfer"])],
                *["serve", "--model", model, "--socket", str(sockets["edgeinfer"]), *common],
            ],
        }
        with running_servers(commands, sockets, folder):
            start: dict[str, int] = {name: len(load(log)) if log.exists() else 0 for name, log in logs.items()}
            bench = [sys.executable, "-m", "edgeinfer.cli", "bench", "--workload", args.workload]
            bench += ["--concurrency", str(args.concurrency), "--repeats", str(args.repeats)]
            for sock in sockets.values():
                bench += ["--socket", str(sock)]
            subprocess.run(bench, check=True)
            for server, log in logs.items():
                report(server, load(log)[start[server] :], args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
