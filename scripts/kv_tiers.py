"""What the cache tiers cost and what they save, on the default model, in one run.

    .venv/bin/python scripts/kv_tiers.py

1. Saved conversations cost running streams nothing: one stream's decode tok/s on an engine
   holding 64 saved conversations in RAM, against the same stream on an engine with an
   empty cache, alternating runs.
2. A warm turn costs about what the new turn's own tokens cost: on a ~1,000-token
   conversation, TTFT of the next turn restored from RAM, and after a restart from
   --cache-dir, against TTFT of a prompt made of the new turn's tokens alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from edgeinfer.bench.workloads import CHAT, messages
from edgeinfer.engine import Engine
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def fill(engine: Engine, n: int) -> None:
    """n distinct ~1,000-token conversations, run 16 at a time, saved as they finish."""
    convs = messages("multi-agent", n, head="[saved] ")
    for k in range(0, n, 16):
        handles = [engine.submit(engine.chat_prompt(c), GREEDY)[0] for c in convs[k : k + 16]]
        for h in handles:
            h.result()


def one_stream_tps(engine: Engine, i: int, tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    prompt = engine.chat_prompt([{"role": "user", "content": f"({i}) {CHAT[i % len(CHAT)]}"}])
    stats = engine.generate(prompt, params).stats
    assert stats.decode_tps is not None
    return stats.decode_tps


def decode_with_saved(base: EngineConfig, saved: int, runs: int, tokens: int) -> None:
    full, empty = make_engine(base), make_engine(base)
    try:
        fill(full, saved)
        held = full.snapshot().cache
        print(f"engine A holds {held.ram_entries} saved conversations ({held.ram_bytes / 2**20:.0f} MiB of RAM)")
        a, b = [], []
        for i in range(runs):
            a.append(one_stream_tps(full, i, tokens))
            b.append(one_stream_tps(empty, i, tokens))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"one stream, {tokens} tokens, median of {runs} alternating runs:")
        print(f"  {saved} saved conversations: {ma:.1f} tok/s; empty cache: {mb:.1f} tok/s; ratio {ma / mb:.3f}")
    finally:
        full.close()
        empty.close()


def ttft(engine: Engine, prompt: list[int], own: list[list[int]]) -> float:
    """TTFT of a prompt; the tokens it had to compute (after what was restored) go to `own`."""
    stats = engine.generate(prompt, GREEDY).stats
    own.append(prompt[stats.cached_tokens :])
    assert stats.ttft_s is not None
    return stats.ttft_s


def warm_turns(base: EngineConfig, agents: int, overlap: bool = False) -> None:
    """TTFT of the next turn: from RAM, after a restart from disk, and of its own tokens alone."""
    new_turn = {"role": "user", "content": "Now summarise what you found in two sentences."}
    with tempfile.TemporaryDirectory(prefix="edgeinfer-kv-") as tmp:
        config = base.replace(cache_dir=Path(tmp))
        ram, disk, alone, sizes = [], [], [], []
        own: list[list[int]] = []
        engine = make_engine(config)
        nexts = []
        try:
            for conv in messages("multi-agent", agents, head="[turns] "):
                first = engine.generate(engine.chat_prompt(conv), GREEDY)
                history = [*conv, {"role": "assistant", "content": first.text}]
                nexts.append([*history, new_turn])
            # The disk tier writes in the background; wait, so that its writes do not share the
            # 2 cores with the turns measured next (docs/benchmarks.md gives the figure with them too).
            if engine.store is not None and engine.store.disk is not None and not overlap:
                engine.store.disk.flush()
            for conv in nexts[: agents // 2]:  # half from RAM now; the other half after the restart
                prompt = engine.chat_prompt(conv)
                ram.append(ttft(engine, prompt, own))
                sizes.append(len(prompt))
            ram_restore = engine.snapshot().cache.restore_ms_mean
        finally:
            engine.close()
        engine = make_engine(config)  # a restart: RAM empty, the disk tier warm
        try:
            for conv in nexts[agents // 2 :]:
                disk.append(ttft(engine, engine.chat_prompt(conv), own))
            cache = engine.snapshot().cache
            hits, disk_restore = cache.disk_hits, cache.restore_ms_mean
        finally:
            engine.close()
        cold = make_engine(base.replace(cache_ram=0))
        try:
            for tokens in own:
                alone.append(ttft(cold, tokens, []))
        finally:
            cold.close()
    r, d, a = statistics.median(ram), statistics.median(disk), statistics.median(alone)
    print(f"next turn of a ~{statistics.mean(sizes):.0f}-token conversation, TTFT medians over {agents // 2} agents:")
    print(f"  from RAM {r * 1000:.0f} ms; after a restart, from disk {d * 1000:.0f} ms ({hits} disk hits)")
    print(f"  mean restore time: RAM {ram_restore or 0:.0f} ms, disk {disk_restore or 0:.0f} ms")
    n_own = statistics.mean(len(t) for t in own)
    print(f"  the new turn's own ~{n_own:.0f} tokens alone {a * 1000:.0f} ms: RAM {r / a:.2f}x, disk {d / a:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saved", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--overlap", action="store_true", help="measure the RAM turns while the disk tier is still writing")
    ap.add_argument("--skip-saved", action="store_true", help="only the warm-turn part")
    args = ap.parse_args()
    base = EngineConfig(parallel=16, ctx_size=16 * 2048, spec="off", cache_ram=4096)
    if not args.skip_saved:
        decode_with_saved(base, args.saved, args.runs, args.tokens)
    warm_turns(base, args.agents, args.overlap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
