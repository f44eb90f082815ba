"""Warm against cold prefixes, measured in one run: what an agent's long system prompt costs.

    python scripts/prefix_cache.py [--system-tokens 1000] [--streams 16]

1. TTFT of a ~1,000-token system prompt plus a short user turn: cold (first time),
   then warm (the same system prompt, a new user turn), alternating a few times.
2. 16 concurrent requests sharing that system prompt: prompt tokens computed, against
   one system prompt plus 16 suffixes.
"""

from __future__ import annotations

import argparse
import statistics

from edgeinfer.engine import Engine
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

TOOLS = [
    ("read_file", "Read a file from the workspace and return its text."),
    ("write_file", "Write text to a file in the workspace, replacing it."),
    ("list_dir", "List the entries of a directory in the workspace."),
    ("run_tests", "Run the project's test suite and return the summary."),
    ("search", "Search the workspace for a regular expression."),
    ("git_diff", "Show the uncommitted changes of the repository."),
]


def system_prompt(engine: Engine, target_tokens: int, variant: int) -> str:
    """An agent-style system prompt of about target_tokens tokens; variant makes it unique per run."""
    head = f"You are coding agent #{variant}. Use the tools below; answer with one JSON tool call.\n\n"
    parts = [head]
    i = 0
    while len(engine.tokenize("".join(parts))) < target_tokens:
        name, doc = TOOLS[i % len(TOOLS)]
        parts.append(
            f'Tool {i}: {{"name": "{name}_{i}", "description": "{doc}", "parameters": {{"path": "string"}}}}\n'
        )
        i += 1
    return "".join(parts)


def turn(engine: Engine, system: str, question: str) -> list[int]:
    return engine.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": question}])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    params = SamplingParams(temperature=0.0, max_tokens=8)
    engine = make_engine(EngineConfig(parallel=args.streams, ctx_size=args.streams * 2048, spec="off"))
    try:
        cold, warm = [], []
        for r in range(args.repeats):
            system = system_prompt(engine, args.system_tokens, r)
            first = engine.generate(turn(engine, system, "List the files in src."), params)
            again = engine.generate(turn(engine, system, "Run the tests."), params)
            cold.append(first.stats.ttft_s)
            warm.append(again.stats.ttft_s)
            print(
                f"run {r}: prompt {first.stats.prompt_tokens} tokens, cold TTFT {first.stats.ttft_s * 1000:.0f} ms; "
                f"warm TTFT {again.stats.ttft_s * 1000:.0f} ms ({again.stats.cached_tokens} tokens from cache)"
            )
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"median TTFT: cold {c * 1000:.0f} ms, warm {w * 1000:.0f} ms, warm/cold {w / c:.1%}")

        system = system_prompt(engine, args.system_tokens, 999)
        engine.reset_prefixes()
        sched = engine.sched
        before_computed, before_cached = sched.prompt_tokens_computed, sched.prompt_tokens_cached
        prompts = [
            engine.chat_prompt(
                [{"role": "system", "content": system}, {"role": "user", "content": f"Task {i}: open file {i}."}]
            )
            for i in range(args.streams)
        ]
        handles = [engine.submit(p, params)[0] for p in prompts]
        for h in handles:
            h.result()
        computed = sched.prompt_tokens_computed - before_computed
        cached = sched.prompt_tokens_cached - before_cached
        total = sum(len(p) for p in prompts)
        shared = len(engine.chat_prompt([{"role": "system", "content": system}]))
        ideal = shared + sum(len(p) - shared for p in prompts)
        print(
            f"{args.streams} concurrent requests, {total} prompt tokens in all: computed {computed}, "
            f"from cache {cached} (one system prompt + {args.streams} suffixes = about {ideal}; "
            f"without sharing: {total})"
        )
    finally:
        engine.close()


if __name__ == "__main__":
    main()
