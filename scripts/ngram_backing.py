"""How often an n-gram draft is right, by how much context matched where it was found.

    .venv/bin/python scripts/ngram_backing.py [--model M] [--streams 8]

Generates greedy answers (speculation off) to `edgeinfer bench`'s workloads, then replays each
answer through the n-gram index the speculator uses: at every answer token it looks up the draft
the index would offer, the length of the match behind it (ngram.BACKING's buckets) and how many of
its tokens the answer went on with. Prints, per bucket, how often the first draft token was right
and the mean tokens accepted of 8: what the speculator's priors by backing stand on
(edgeinfer/speculative/ngram.py).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from edgeinfer.bench.workloads import MAX_TOKENS, messages
from edgeinfer.models.catalog import resolve_model
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine
from edgeinfer.speculative.ngram import BACKING, NgramIndex, backing_of

WORKLOADS = ("chat", "code-edit", "agent", "multi-agent", "json")


def replay(prompt: list[int], answer: list[int], k: int, table: dict[int, list[int]]) -> None:
    """Add each answer position's (offered, first right, tokens right) to table[bucket]."""
    index = NgramIndex()
    index.extend(prompt + answer[:1])  # the first token comes from a plain step
    for j in range(1, len(answer)):
        draft, matched = index.draft(k)
        if draft:
            right = 0
            while right < len(draft) and j + right < len(answer) and draft[right] == answer[j + right]:
                right += 1
            row = table[backing_of(matched)]
            row[0] += 1
            row[1] += right > 0
            row[2] += right
        index.extend([answer[j]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or catalog name (default: SmolLM2-135M Q4_1).")
    ap.add_argument("--streams", type=int, default=8, help="Conversations per workload.")
    ap.add_argument("--draft", type=int, default=8, help="Draft tokens looked up at each position.")
    ap.add_argument("--eos", action="store_true", help="Let answers end at end-of-turn (default: ignore_eos).")
    args = ap.parse_args()
    config = EngineConfig(model=resolve_model(args.model), parallel=4, ctx_size=16384, spec="off")
    by_workload: dict[str, dict[int, list[int]]] = {}
    with make_engine(config) as engine:
        for workload in WORKLOADS:
            table: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
            params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS[workload], ignore_eos=not args.eos)
            for conversation in messages(workload, args.streams):
                prompt = engine.chat_prompt(conversation)
                replay(prompt, engine.generate(prompt, params).token_ids, args.draft, table)
            by_workload[workload] = table
            print(f"{workload}: {args.streams} answers", file=sys.stderr)
    total: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    for table in by_workload.values():
        for b, (n, first, right) in table.items():
            total[b][0] += n
            total[b][1] += first
            total[b][2] += right
    print(f"matched tokens | offered | first right | mean right of {args.draft} | " + " | ".join(WORKLOADS))
    for i, b in enumerate(BACKING):
        n, first, right = total[b]
        if not n:
            continue
        span = f"{b}" if i + 1 == len(BACKING) or BACKING[i + 1] == b + 1 else f"{b}-{BACKING[i + 1] - 1}"
        span += "+" if i + 1 == len(BACKING) else ""
        per = [f"{t[b][1] / t[b][0]:.2f}" if t[b][0] else "-" for t in by_workload.values()]
        print(f"{span} | {n} | {first / n:.2f} | {right / n:.1f} | " + " | ".join(per))
    return 0


if __name__ == "__main__":
    sys.exit(main())
