"""Measure how often packed greedy decoding equals one-at-a-time decoding, and how close the misses are.

    python scripts/packed_vs_alone.py [--flash-attn auto|on|off] [--max-tokens 64]

For each prompt it reports whether the packed run gave the same tokens as the
stream run alone, and at the first difference the gap (in nats) between the alone
run's top two candidates: a small gap means a near-tie flipped by arithmetic.
"""

from __future__ import annotations

import argparse

from edgeinfer.bench.workloads import QUESTIONS as PROMPTS
from edgeinfer.engine import Engine
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine


def compare(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[tuple[bool, int, float]]:
    """(identical, first differing position or -1, alone top-2 gap there) per prompt."""
    alone = [engine.generate(p, params) for p in prompts]
    packed = [h.result() for h in [engine.submit(p, params)[0] for p in prompts]]
    out = []
    for a, b in zip(alone, packed, strict=True):
        if a.token_ids == b.token_ids:
            out.append((True, -1, 0.0))
            continue
        i = next(i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y)
        top = a.logprobs[i].top
        out.append((False, i, top[0][2] - top[1][2]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flash-attn", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    engine = make_engine(
        EngineConfig(parallel=len(PROMPTS), ctx_size=8192, cache_ram=0, flash_attn=args.flash_attn, spec="off")
    )
    try:
        system = {"role": "system", "content": "You are a helpful assistant."}
        prompts = [engine.chat_prompt([system, {"role": "user", "content": p}]) for p in PROMPTS]
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=5)
        rows = compare(engine, prompts, params)
    finally:
        engine.close()
    same = sum(r[0] for r in rows)
    gaps = [r[2] for r in rows if not r[0]]
    print(f"flash-attn {args.flash_attn}: {same}/{len(rows)} prompts identical over {args.max_tokens} greedy tokens")
    for text, (ok, pos, gap) in zip(PROMPTS, rows, strict=True):
        print(f"  {'same' if ok else f'differs at token {pos:>3}, alone top-2 gap {gap:.3f} nats'}  {text}")
    if gaps:
        print(f"largest top-2 gap at a first difference: {max(gaps):.3f} nats")


if __name__ == "__main__":
    main()
