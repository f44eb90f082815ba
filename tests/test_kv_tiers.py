"""KV layouts and cache tiers on the real model: the same text either way, warm turns from RAM and from disk."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgeinfer.cli import main
from edgeinfer.errors import RequestError
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine

from . import gate
from .gate import same_or_near_tie

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0, max_tokens=24, logprobs=5)
SYSTEM = "You are a patient tutor. You explain things with short examples and you never use jargon. " * 3


def turns(engine, *questions_and_answers):
    messages = [{"role": "system", "content": SYSTEM}]
    for i, text in enumerate(questions_and_answers):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return engine.chat_prompt(messages)


def test_per_sequence_and_unified_layouts_give_the_same_greedy_text(model_path):
    questions = ["What is a noun?", "Why is the sea salty?", "Name a prime number.", "What is rain?"]
    config = EngineConfig(model=model_path, parallel=4, ctx_size=4096, kv_layout="unified", spec="off")
    with make_engine(config) as eng:
        assert eng.snapshot().kv.layout == "unified"
        want = [h.result() for h in [eng.submit(turns(eng, q), GREEDY)[0] for q in questions]]
    with make_engine(config.replace(kv_layout="per-seq")) as eng:
        assert eng.ctx.n_ctx_seq == 1024 and eng.snapshot().kv.cells_per_seq == 1024
        prompts = [turns(eng, q) for q in questions]
        got = [h.result() for h in [eng.submit(p, GREEDY)[0] for p in prompts]]
        for w, g, p in zip(want, got, prompts, strict=True):
            same_or_near_tie(w, g, eng, p)


def test_a_prompt_longer_than_a_streams_share_is_a_clear_error(model_path):
    with make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=1024)) as eng:
        long_prompt = eng.tokenize("word " * 400)
        with pytest.raises(RequestError, match="a stream's share of the context holds 256") as e:
            eng.submit(long_prompt, SamplingParams(max_tokens=8))
        assert e.value.param == "prompt" and "--kv-layout unified" in str(e.value)
    with make_engine(EngineConfig(model=model_path, parallel=4, ctx_size=1024, kv_layout="unified")) as eng:
        assert eng.generate(long_prompt, SamplingParams(max_tokens=4)).stats.completion_tokens == 4


def test_the_next_turn_goes_on_where_the_last_ended_or_from_ram_and_computes_only_its_own_tokens(model_path):
    config = EngineConfig(model=model_path, parallel=2, ctx_size=4096, spec="off")
    with make_engine(config.replace(cache_ram=0)) as cold:
        first = cold.generate(turns(cold, "What is a verb?"), GREEDY)
        second_prompt = turns(cold, "What is a verb?", first.text, "Give one more example.")
        want = cold.generate(second_prompt, GREEDY)
    with make_engine(config) as eng:
        n_first = len(turns(eng, "What is a verb?"))
        again = eng.generate(turns(eng, "What is a verb?"), GREEDY)
        gate.same_shapes(again.token_ids, first.token_ids, "greedy, a cold cache in both, nothing drafted")
        assert eng.snapshot().kv.used_cells == 0  # its reservation was freed at once
        assert eng.wait_idle() and eng.snapshot().prefix_cache.kept == 1  # its KV stayed in its sequence
        second = eng.generate(second_prompt, GREEDY)
        snap = eng.snapshot()
        same_or_near_tie(want, second, eng, second_prompt)
    assert snap.prefix_cache.resumed_in_place == 1 and snap.cache.saves == 0 and snap.cache.restores == 0
    # Everything up to the end of the first reply was there; only the new turn was computed.
    assert second.stats.cached_tokens >= n_first + len(first.token_ids) - 2
    # With one sequence, another conversation in between sends the first to RAM; its next turn comes back.
    with make_engine(config.replace(parallel=1)) as eng:
        eng.generate(turns(eng, "What is a verb?"), GREEDY)
        eng.generate(eng.tokenize("Count from one to ten: one, two, three,"), SamplingParams(max_tokens=4))
        assert eng.wait_idle() and eng.snapshot().cache.ram_entries == 1
        second = eng.generate(second_prompt, GREEDY)
        cache = eng.snapshot().cache
        same_or_near_tie(want, second, eng, second_prompt)
    assert cache.restores == 1 and cache.ram_hits == 1
    assert second.stats.cached_tokens >= n_first + len(first.token_ids) - 2


def test_a_restarted_engine_with_a_cache_dir_starts_warm(model_path, tmp_path):
    config = EngineConfig(model=model_path, parallel=2, ctx_size=4096, spec="off", cache_dir=tmp_path)
    with make_engine(config) as eng:
        prompt = turns(eng, "Explain what a fraction is.")
        first = eng.generate(prompt, GREEDY)
    assert list((tmp_path).rglob("*.kv"))  # written on the way out at the latest
    with make_engine(config) as eng:
        assert eng.snapshot().cache.disk_entries == 1
        again = eng.generate(turns(eng, "Explain what a fraction is.", first.text, "And a decimal?"), GREEDY)
        cache = eng.snapshot().cache
    assert cache.disk_hits == 1 and again.stats.cached_tokens >= len(prompt)
    # Another KV type cannot use these bytes: it starts cold, and says nothing is wrong.
    with make_engine(config.replace(kv_type="q8_0")) as eng:
        assert eng.snapshot().cache.disk_entries == 0
        cold = eng.generate(turns(eng, "Explain what a fraction is.", first.text, "And a decimal?"), GREEDY)
        assert cold.stats.cached_tokens == 0


def test_a_kept_conversation_is_on_disk_before_the_engine_closes(model_path, tmp_path):
    """Defect: a conversation kept in its sequence reached the disk tier only when the sequence was wanted or at
    close: a crash or a kill lost it, and the restart computed it again. A second engine on the same folder,
    opened while the first one runs (as a restart after a kill would find it), starts warm."""
    config = EngineConfig(model=model_path, parallel=2, ctx_size=4096, spec="off", cache_dir=tmp_path)
    with make_engine(config) as eng:
        prompt = turns(eng, "Explain what a fraction is.")
        first = eng.generate(prompt, GREEDY)
        assert eng.wait_idle()
        assert eng.snapshot().prefix_cache.kept == 1  # still in its sequence...
        eng.store.disk.flush()
        assert list(tmp_path.rglob("*.kv"))  # ...and on disk already
        with make_engine(config) as other:
            again = other.generate(turns(other, "Explain what a fraction is.", first.text, "And a decimal?"), GREEDY)
            assert other.snapshot().cache.disk_hits == 1 and again.stats.cached_tokens >= len(prompt)


def test_chat_resume_continues_the_last_conversation_warm(tmp_path):
    args = ["chat", "--temperature", "0", "--max-tokens", "16", "--cache-dir", str(tmp_path)]
    first = CliRunner().invoke(main, args, input="My name is Ada.\n/exit\n")
    assert first.exit_code == 0, first.output
    resumed = CliRunner().invoke(main, [*args, "--resume"], input="What is my name?\n/exit\n")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed a conversation of 1 turns" in resumed.output
    stats = [ln for ln in resumed.output.splitlines() if "tokens" in ln and "tok/s" in ln]
    assert "prompt tokens reused" in stats[-1]  # the first session's KV, read back from disk
    missing = CliRunner(env={"XDG_DATA_HOME": str(tmp_path / "empty")}).invoke(main, ["chat", "--resume"])
    assert missing.exit_code != 0 and "no conversation to resume" in missing.output
