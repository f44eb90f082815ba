"""What a decode step costs outside llama_decode, and what greedy sampling costs, in one run.

    .venv/bin/python scripts/step_overhead.py

One in-process engine (16 slots, speculation off) runs 1 and 16 streams of greedy
generation, taking turns between two ways of picking the greedy token: reading the largest
logit of the row (what edgeinfer does) and llama.cpp's own sampler chain
(llama_sampler_sample, which first copies every logit into a candidates array). For each it
prints tok/s, and per step: the time inside llama_decode, the time picking tokens, and the
rest of the engine's Python (scheduling, text, events).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

from edgeinfer.bench.workloads import CHAT, messages
from edgeinfer.llamacpp import Sampler
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

_picking = [0.0]  # seconds spent in Sampler.sample during the current run
_native = [False]  # build samplers that go through llama.cpp's chain even for greedy


def _instrument() -> None:
    init, sample = Sampler.__init__, Sampler.sample

    def timed_sample(self: Sampler, ctx: Any, row: int) -> int:
        t = time.perf_counter()
        try:
            return sample(self, ctx, row)
        finally:
            _picking[0] += time.perf_counter() - t

    def init_maybe_native(self: Sampler, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        if _native[0]:
            self._argmax = False

    Sampler.sample = timed_sample  # type: ignore[method-assign]
    Sampler.__init__ = init_maybe_native  # type: ignore[method-assign]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    _instrument()
    engine = make_engine(EngineConfig(parallel=16, spec="off", cache_ram=0))
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    rows: dict[tuple[int, str], list[tuple[float, float, float, float]]] = defaultdict(list)
    try:
        engine.generate(engine.chat_prompt([{"role": "user", "content": CHAT[0]}]), params)  # warm-up
        for r in range(args.rounds):
            for streams in (1, 16):
                for way in ("largest logit", "llama.cpp chain"):
                    _native[0] = way == "llama.cpp chain"
                    prompts = [engine.chat_prompt(m) for m in messages("chat", streams, head=f"[{r} {way}] ")]
                    m = engine.metrics
                    d0, s0, g0, _picking[0] = m.decode_seconds, m.steps, m.generated_tokens, 0.0
                    t = time.perf_counter()
                    handles = [engine.submit(p, params)[0] for p in prompts]
                    for h in handles:
                        h.result()
                    wall = time.perf_counter() - t
                    steps, decode = m.steps - s0, m.decode_seconds - d0
                    rows[streams, way].append(
                        ((m.generated_tokens - g0) / wall, decode / steps, _picking[0] / steps, wall / steps)
                    )
    finally:
        engine.close()
    print(f"greedy, {args.tokens} tokens a stream, medians of {args.rounds} alternating rounds; ms per step:")
    head = ("streams", "greedy token from", "tok/s", "decode", "picking", "rest", "outside decode")
    print("{:>7} {:<17} {:>6} {:>7} {:>8} {:>6} {:>15}".format(*head))
    for (streams, way), runs in sorted(rows.items()):
        tps, dec, pick, step = (statistics.median(x) for x in zip(*runs, strict=True))
        rest = step - dec - pick
        share = (step - dec) / step
        print(
            f"{streams:>7} {way:<17} {tps:>6.1f} {dec * 1e3:>7.2f} {pick * 1e3:>8.2f} {rest * 1e3:>6.2f} {share:>14.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
