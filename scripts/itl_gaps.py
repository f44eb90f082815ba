"""Every inter-token gap of one streamed answer, through a running server's Unix socket: where the ITL spikes fall.

    .venv/bin/python scripts/itl_gaps.py --socket /tmp/edgeinfer.sock --workload multi-agent

Sends stream 0 of a workload (`edgeinfer bench`'s prompts) as a streamed chat completion,
greedy, `ignore_eos`, --repeats times (the first one cold, the rest warm), and prints each
answer's gaps between content chunks in milliseconds, then their p50 and p99 over the warm
answers and the last gap of each (the answer's end, where a server's bookkeeping for a
finished stream shows), and how many long gaps were late deliveries against slow steps. Works
against `edgeinfer serve` and llama-server alike.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import httpx
from one_stream import pct, text_arrivals, workload_turn

from edgeinfer.bench.workloads import WORKLOADS


def gaps_of(socket: Path, body: dict[str, object]) -> list[float]:
    """The gaps (ms) between the content chunks of one streamed answer, on a connection of its own: llama-server
    closed a kept-alive connection as the next request went out on it (twice in an afternoon: "Server
    disconnected without sending a response")."""
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://server", timeout=300) as h:
        stamps = text_arrivals(h, "/v1/chat/completions", body, socket.name)
    return [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True, type=Path, help="The server's Unix socket.")
    ap.add_argument("--workload", default="multi-agent", choices=WORKLOADS)
    ap.add_argument("--max-tokens", type=int, default=None, help="Default: the workload's own.")
    ap.add_argument("--repeats", type=int, default=4, help="Answers; the first is cold.")
    ap.add_argument("--summary", action="store_true", help="Only the figures over the warm answers, not each gap.")
    args = ap.parse_args()
    if not args.socket.exists():
        sys.exit(f"no socket at {args.socket}: start a server there first (edgeinfer serve --socket ...)")
    body = workload_turn(args.workload, args.max_tokens)
    warm: list[float] = []
    lasts: list[float] = []
    pairs: list[tuple[float, float]] = []  # each gap and the next, within an answer
    for i in range(args.repeats):
        gaps = gaps_of(args.socket, body)
        if not args.summary:
            print(f"{'cold' if i == 0 else 'warm'}: " + " ".join(f"{g:.1f}" for g in gaps))
        if i > 0 and gaps:
            warm += gaps
            lasts.append(gaps[-1])
            pairs += itertools.pairwise(gaps)
    if warm:
        p50 = pct(warm, 0.5)
        print(f"warm ITL p50 {p50:.1f} ms, p99 {pct(warm, 0.99):.1f} ms ({pct(warm, 0.99) / p50:.2f}x)")
        last = statistics.median(lasts)
        print(f"last gap of each warm answer: median {last:.1f} ms ({last / p50:.2f}x p50)")
        # A long gap followed by a short one is a token delivered late from a step that ended on time (the
        # server's path to the socket); one followed by an ordinary gap is a slow step.
        long = [b for a, b in pairs if a > 1.4 * p50]
        late = sum(1 for b in long if b < 0.75 * p50)
        print(
            f"gaps over 1.4x p50: {late} followed by a short one (late delivery), {len(long) - late} not (slow steps)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
