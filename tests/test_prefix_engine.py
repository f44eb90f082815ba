"""The prefix cache on the real model: reuse is exact where it should be, and never corrupts a stream."""

from __future__ import annotations

import pytest

from edgeinfer.engine import Engine
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

from .gate import same_or_near_tie

pytestmark = pytest.mark.model

SYSTEM = (
    "You are a careful assistant for a small bakery. You answer questions about opening hours, "
    "bread, cakes and prices. Opening hours: 7 to 18 on weekdays, 8 to 14 on Saturdays, closed on "
    "Sundays. Bread: sourdough, rye, baguette. Cakes: lemon, chocolate, carrot. Keep answers short."
)
QUESTIONS = ["When do you open on Saturday?", "Do you sell rye bread?", "Which cakes do you have?"]
REF = SamplingParams(temperature=0, max_tokens=24, logprobs=5)
PLAIN = SamplingParams(temperature=0, max_tokens=24)


def ask(engine: Engine, question: str, system: str = SYSTEM) -> list[int]:
    return engine.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": question}])


def test_shared_system_prompt_hits_match_no_cache_and_counters_add_up(model_path):
    with make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=4096, cache_ram=0)) as cold:
        want = [cold.generate(ask(cold, q), REF) for q in QUESTIONS]
    with make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=4096)) as eng:
        got = [eng.generate(ask(eng, q), PLAIN) for q in QUESTIONS]
        total = sum(len(ask(eng, q)) for q in QUESTIONS)
        sched = eng.sched
        assert sched.prompt_tokens_cached + sched.prompt_tokens_computed == total
        system_only = eng.chat_prompt([{"role": "system", "content": SYSTEM}])
        for w, g, q in zip(want, got, QUESTIONS, strict=True):
            same_or_near_tie(w, g, eng, ask(eng, q))
    assert got[0].stats.cached_tokens == 0
    # The later questions reuse at least the system prompt's KV.
    assert all(g.stats.cached_tokens >= len(system_only) - 4 for g in got[1:])


def test_divergence_mid_prefix_reuses_only_up_to_it(model_path):
    other = SYSTEM.replace("Cakes: lemon", "Pies: apple")
    with make_engine(EngineConfig(model=model_path, parallel=2, ctx_size=4096)) as eng:
        a, b = ask(eng, QUESTIONS[0]), ask(eng, QUESTIONS[0], other)
        common = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        eng.generate(a, PLAIN)
        r = eng.generate(b, PLAIN)
    assert r.stats.cached_tokens == common


def test_ram_tier_evicts_least_recently_used_and_leaves_live_streams_intact(model_path):
    long_q = "Write a long story about a baker who travels the world."
    with make_engine(EngineConfig(model=model_path, parallel=2, ctx_size=2048, cache_ram=0)) as ref_engine:
        want = ref_engine.generate(ask(ref_engine, long_q), SamplingParams(temperature=0, max_tokens=300, logprobs=5))
    # 4 MiB of RAM holds two of these conversations (about 1.5 MiB each): saving more evicts the oldest.
    with make_engine(EngineConfig(model=model_path, parallel=2, ctx_size=2048, cache_ram=4)) as eng:
        story = eng.submit(ask(eng, long_q), SamplingParams(temperature=0, max_tokens=300))[0]
        for i in range(6):
            eng.generate(ask(eng, f"Question {i}: {QUESTIONS[i % 3]}", system=f"Shop {i}. " + SYSTEM), PLAIN)
        got = story.result()
        assert eng.wait_idle()  # the answers' KV is saved once they are out
        cache = eng.snapshot().cache
        assert cache.ram_evictions >= 3 and cache.ram_bytes <= 4 << 20
        same_or_near_tie(want, got, eng, ask(eng, long_q))
        # The newest conversation is still there, the first one is gone.
        newest = ask(eng, f"Question 5: {QUESTIONS[2]}", system="Shop 5. " + SYSTEM)
        oldest = ask(eng, f"Question 0: {QUESTIONS[0]}", system="Shop 0. " + SYSTEM)
        assert eng.generate(newest, PLAIN).stats.cached_tokens == len(newest) - 1
        assert eng.generate(oldest, PLAIN).stats.cached_tokens == 0


def test_a_short_sequence_shared_through_its_state_matches_a_whole_stream_copy(model_path):
    """Per-sequence KV on the CPU: seq_share copies a sequence filling at most half its stream through its state
    (its own cells, at once); a longer one, or one whose own stream copy has not landed yet, as the whole stream
    at the next decode. The next token's logits after either copy are the same, bit for bit: the same bytes at
    the same positions, decoded in batches of the same shape."""
    import numpy as np

    from edgeinfer.llamacpp import Batch, Context, ContextParams, Model

    model = Model(model_path)
    ctx = Context(model, ContextParams(n_ctx=4 * 256, n_seq_max=4, flash_attn="off"))  # 256 cells a stream
    batch = Batch(256)
    try:
        text = model.vocab.tokenize(SYSTEM * 3)
        batch.add(0, text[:100], 0, False)
        assert ctx.decode(batch)

        def next_logits(seq: int) -> np.ndarray:
            batch.clear()
            row = batch.add(seq, text[60:61], 60, True)
            assert ctx.decode(batch)
            ctx.seq_rm(seq, 60, -1)
            return ctx.logits(row)

        assert ctx.seq_share(0, 1, 60) is False  # 100 of 256 cells: through the state, at once
        assert ctx.seq_pos_max(1) == 59
        by_state = next_logits(1)
        ctx.seq_cp(0, 2)  # a whole-stream copy, landing at the next decode
        ctx.seq_rm(2, 60, -1)
        assert ctx.seq_share(2, 3, 60) is True  # its source has not landed yet: copied as a stream, behind it
        by_stream, behind = next_logits(2), next_logits(3)
        assert np.array_equal(by_state, by_stream) and np.array_equal(by_state, behind)
        batch.clear()
        batch.add(0, text[100:160], 100, False)
        assert ctx.decode(batch)  # 160 of 256 cells: more than half
        ctx.seq_rm(1)
        assert ctx.seq_share(0, 1, 60) is True
        assert np.array_equal(next_logits(1), by_state)
    finally:
        batch.close()
        ctx.close()
        model.close()
