"""A conversation's warm next turn, one stream, through several running servers' sockets taking turns: TTFT and
decode rate.

    .venv/bin/python scripts/warm_turns.py --sockets /tmp/a.sock,/tmp/b.sock --workload multi-agent

Sends stream 0 of a workload (`edgeinfer bench`'s prompts: the same conversation each time, so
each server holds it from the turn before) as a streamed chat completion, greedy, `ignore_eos`,
--rounds times to each server in turn after one warm-up each, and prints per server the TTFT
(median and best), the decode rate after the first chunk and the whole answer's tok/s (best and
median). Works against `edgeinfer serve` and llama-server alike, e.g. two edgeinfer commits and
a llama-server, all up at once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx
from one_stream import text_arrivals, workload_turn

from edgeinfer.bench.workloads import WORKLOADS


def turn(sock: Path, body: dict[str, object]) -> tuple[float, float, float]:
    """(TTFT s, decode tok/s after the first chunk, the answer's tok/s) of one streamed answer."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://server", timeout=300) as http:
        t0 = time.perf_counter()
        stamps = text_arrivals(http, "/v1/chat/completions", body, sock.name)
    if len(stamps) < 2:
        sys.exit(f"{sock}: fewer than two chunks of text came back")
    n = int(str(body["max_tokens"]))
    return stamps[0] - t0, (len(stamps) - 1) / (stamps[-1] - stamps[0]), n / (stamps[-1] - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sockets", required=True, help="Comma-separated Unix sockets of running servers.")
    ap.add_argument("--workload", default="multi-agent", choices=WORKLOADS)
    ap.add_argument("--max-tokens", type=int, default=None, help="Default: the workload's own.")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    socks = [Path(s) for s in args.sockets.split(",")]
    if missing := [s for s in socks if not s.exists()]:
        sys.exit(f"no socket at {', '.join(map(str, missing))}: start the servers first (edgeinfer serve --socket ...)")
    body = workload_turn(args.workload, args.max_tokens)
    results: dict[Path, list[tuple[float, float, float]]] = {s: [] for s in socks}
    for s in socks:
        turn(s, body)  # the conversation is now held by every server
    for _ in range(args.rounds):
        for s in socks:
            results[s].append(turn(s, body))
    for s, r in results.items():
        ttft, decode, whole = ([x[i] for x in r] for i in range(3))
        print(
            f"{s}: TTFT median {1000 * statistics.median(ttft):.1f} ms, best {1000 * min(ttft):.1f} | "
            f"decode best {max(decode):.1f} tok/s, median {statistics.median(decode):.1f} | "
            f"answer best {max(whole):.1f} tok/s, median {statistics.median(whole):.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
