"""Speculative decoding on the real model: lossless output, clean KV after rejections, vocab checks."""

from __future__ import annotations

import struct

import pytest
from click.testing import CliRunner

from edgeinfer.bench.workloads import code_edit_prompt
from edgeinfer.cli import main
from edgeinfer.engine import make_engine
from edgeinfer.errors import ConfigError
from edgeinfer.options import EngineConfig, SamplingParams

from .conftest import assert_same_or_near_tie, chat

# Verifying k drafts decodes k+1 rows of one stream in one batch, and llama.cpp's CPU
# kernels round differently for different batch shapes (README, "Packed and alone"):
# greedy runs with and without speculation may part, but only at near-ties.
EXACT = {"parallel": 2, "ctx_size": 4096}
REF = SamplingParams(temperature=0, max_tokens=80, logprobs=5)  # logprobs: the reference's top five
PROMPTS = [code_edit_prompt(0), code_edit_prompt(1), "List the days of the week, then list them again."]


def run_all(config: EngineConfig, params: SamplingParams) -> tuple[list, dict]:
    with make_engine(config) as eng:
        outs = [eng.generate(chat(eng, p), params) for p in PROMPTS]
        return outs, eng.snapshot().spec


@pytest.fixture(scope="module")
def baseline(model_path):
    outs, _ = run_all(EngineConfig(model=model_path, spec="off", **EXACT), REF)
    return outs


@pytest.mark.parametrize("mode", ["ngram", "auto"])
def test_greedy_ngram_speculation_equals_no_speculation(model_path, baseline, mode):
    outs, stats = run_all(
        EngineConfig(model=model_path, spec=mode, **EXACT), SamplingParams(temperature=0, max_tokens=80)
    )
    for b, o in zip(baseline, outs, strict=True):
        assert_same_or_near_tie(b, o)
    assert stats.drafted > 0 and 0 < stats.accepted <= stats.drafted


def test_greedy_draft_model_speculation_equals_no_speculation(model_path, baseline):
    config = EngineConfig(model=model_path, spec="draft", draft_model=model_path, **EXACT)
    outs, stats = run_all(config, SamplingParams(temperature=0, max_tokens=80))
    for b, o in zip(baseline, outs, strict=True):
        assert_same_or_near_tie(b, o)
    # The draft is the target itself: every confident draft is accepted.
    assert stats.drafted > 0 and stats.accepted / stats.drafted > 0.9


def test_seeded_sampling_with_ngram_speculation_is_reproducible(model_path):
    # Sample-and-match draws every emitted token from the stream's own seeded sampler.
    params = SamplingParams(temperature=0.8, max_tokens=60, seed=42)
    a, stats = run_all(EngineConfig(model=model_path, spec="ngram", **EXACT), params)
    b, _ = run_all(EngineConfig(model=model_path, spec="ngram", **EXACT), params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert stats.drafted > 0 and stats.accepted > 0


def test_kv_is_clean_after_rejections(model_path):
    params = SamplingParams(temperature=0, max_tokens=60)
    with make_engine(EngineConfig(model=model_path, spec="ngram", **EXACT)) as eng:
        first = eng.generate(chat(eng, PROMPTS[0]), params)
        stats = eng.snapshot().spec
        assert stats.drafted > stats.accepted  # there were rejections
        # Continue from the KV that held rejected drafts (the retained prefix is taken over).
        longer = chat(eng, PROMPTS[0]) + first.token_ids[:-1]
        cont = eng.generate(longer, params)
        assert cont.stats.cached_tokens >= len(longer) - 2
    with make_engine(EngineConfig(model=model_path, spec="off", cache_ram=0, **EXACT)) as fresh:
        want = fresh.generate(longer, SamplingParams(temperature=0, max_tokens=60, logprobs=5))
    assert_same_or_near_tie(want, cont)


def test_rejection_sampling_path_runs_and_counts(model_path):
    config = EngineConfig(model=model_path, spec="draft", draft_model=model_path, **EXACT)
    with make_engine(config) as eng:
        r = eng.generate(chat(eng, PROMPTS[2]), SamplingParams(temperature=0.7, max_tokens=40, seed=3))
        stats = eng.snapshot().spec
    assert r.stats.completion_tokens == 40 or r.finish_reason == "stop"
    assert stats.verifications > 0 and stats.accepted <= stats.drafted
    by_pos = [x for x in stats.acceptance_by_position if x is not None]
    assert by_pos and all(0.0 <= x <= 1.0 for x in by_pos)


def with_one_token_renamed(src, dst) -> None:
    """A copy of the model whose vocabulary differs in one token (same length, so offsets hold)."""
    data = bytearray(src.read_bytes())
    token = b"ugging"
    needle = struct.pack("<Q", len(token)) + token
    i = data.find(needle)
    assert i > 0 and data.find(needle, i + 1) == -1
    data[i + 8 : i + 8 + len(token)] = b"uggin_"
    dst.write_bytes(bytes(data))


def test_a_draft_model_with_another_vocabulary_is_refused(model_path, tmp_path):
    bad = tmp_path / "other-vocab.gguf"
    with_one_token_renamed(model_path, bad)
    with pytest.raises(ConfigError, match="vocabulary"):
        make_engine(EngineConfig(model=model_path, spec="draft", draft_model=bad, **EXACT))
    result = CliRunner().invoke(main, ["generate", "hi", "--spec", "draft", "--draft-model", str(bad)])
    assert result.exit_code != 0 and "share the target's vocabulary" in result.output
    assert "Traceback" not in result.output


def test_spec_draft_without_a_draft_model_is_a_clear_error():
    result = CliRunner().invoke(main, ["generate", "hi", "--spec", "draft"])
    assert result.exit_code != 0 and "--draft-model" in result.output


def test_forked_streams_from_a_kept_prefix_finish_with_speculation_on(model_path):
    with make_engine(EngineConfig(model=model_path, spec="ngram", **EXACT)) as eng:
        prompt = chat(eng, PROMPTS[2])
        eng.generate(prompt, SamplingParams(temperature=0, max_tokens=4))
        # The whole prompt is kept: the leader starts one token from the end, and its first
        # logits row also starts its forks.
        results = [h.result() for h in eng.submit(prompt, SamplingParams(temperature=0, max_tokens=20), n=2)]
    assert [r.stats.completion_tokens for r in results] == [20, 20] or all(r.finish_reason == "stop" for r in results)
    assert results[0].token_ids == results[1].token_ids
