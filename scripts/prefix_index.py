"""What finding a prompt's longest held prefix costs on the engine thread: edgeinfer's PrefixIndex, and optionally
another implementation of the same interface (an older commit's), in one run.

    .venv/bin/python scripts/prefix_index.py
    git show d703e58:edgeinfer/engine/prefix.py > /tmp/trie.py
    .venv/bin/python scripts/prefix_index.py --other /tmp/trie.py:PrefixTrie

Each round holds --held prompts of --length tokens that share most of their tokens (turns of one
conversation), then times inserting them and looking the full prompt up; best of --rounds, per call.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
from typing import Any

from edgeinfer.engine.prefix import PrefixIndex


def load(spec: str) -> Any:
    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("other_prefix", path)
    assert module_spec is not None and module_spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def timed(cls: Any, prompt: list[int], held: int, rounds: int) -> tuple[float, float]:
    best_insert = best_longest = float("inf")
    for _ in range(rounds):
        index = cls()
        t = time.perf_counter()
        for k in range(held):
            index.insert(k, prompt[: len(prompt) - held + k])
        best_insert = min(best_insert, (time.perf_counter() - t) / held)
        t = time.perf_counter()
        for _ in range(held):
            index.longest(prompt)
        best_longest = min(best_longest, (time.perf_counter() - t) / held)
    return best_insert, best_longest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=1000, help="Tokens in the prompt.")
    ap.add_argument("--held", type=int, default=20, help="Prompts held at once.")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--other", default=None, help="FILE:CLASS of another implementation to time beside it.")
    args = ap.parse_args()
    rng = random.Random(1)
    prompt = [rng.randrange(49152) for _ in range(args.length)]
    impls = [("PrefixIndex", PrefixIndex)] + ([(args.other, load(args.other))] if args.other else [])
    for name, cls in impls:
        ins, lon = timed(cls, prompt, args.held, args.rounds)
        shape = f"{args.length} tokens, {args.held} held"
        print(f"{name}: insert {1000 * ins:.3f} ms, longest {1000 * lon:.3f} ms ({shape})")


if __name__ == "__main__":
    main()
