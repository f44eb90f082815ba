"""Speculative decoding on the real model: lossless output, clean KV after rejections, vocab checks."""

from __future__ import annotations

import struct
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
from click.testing import CliRunner

from edgeinfer.bench.workloads import code_edit_prompt
from edgeinfer.cli import main
from edgeinfer.engine import Engine
from edgeinfer.engine.stats import SpeculationStats
from edgeinfer.errors import ConfigError
from edgeinfer.options import EngineConfig, SamplingParams
from edgeinfer.runtime import make_engine
from edgeinfer.speculative.verify import sampling_probs

from . import gate
from .gate import chat, same_or_near_tie

pytestmark = pytest.mark.model

# Verifying k drafts decodes k+1 rows of one stream in one batch, and llama.cpp's CPU
# kernels round differently for different batch shapes (docs/testing.md):
# greedy runs with and without speculation may part, but only at near-ties.
EXACT = {"parallel": 2, "ctx_size": 4096}
REF = SamplingParams(temperature=0, max_tokens=80, logprobs=5)  # logprobs: the reference's top five
PROMPTS = [code_edit_prompt(0), code_edit_prompt(1), "List the days of the week, then list them again."]


def run_all(config: EngineConfig, params: SamplingParams, ref: list | None = None) -> tuple[list, SpeculationStats]:
    """Each prompt's result, and the speculation counters; with ref, each result is checked against it."""
    with make_engine(config) as eng:
        prompts = [chat(eng, p) for p in PROMPTS]
        outs = [eng.generate(p, params) for p in prompts]
        stats = eng.snapshot().spec  # before the helper's forced runs add to it
        for want, got, p in zip(ref or [], outs, prompts, strict=False):
            same_or_near_tie(want, got, eng, p)
        return outs, stats


@pytest.fixture(scope="module")
def baseline(model_path):
    outs, _ = run_all(EngineConfig(model=model_path, spec="off", **EXACT), REF)
    return outs


def test_a_new_drafter_is_one_module_and_its_registration(model_path, baseline):
    """tests/toy_drafter.py, registered: its drafts go through the same verification, losslessly."""
    from edgeinfer.speculative import drafting

    from .toy_drafter import echo_for

    drafting.register_drafter(echo_for)  # the registration line
    try:
        config = EngineConfig(model=model_path, spec="ngram", **EXACT)
        _, stats = run_all(config, SamplingParams(temperature=0, max_tokens=80), baseline)
    finally:
        drafting.DRAFTERS.remove(echo_for)
    assert stats.source == "echo" and stats.drafted > 0 and stats.accepted <= stats.drafted


@pytest.mark.parametrize("mode", ["ngram", "auto"])
def test_greedy_ngram_speculation_equals_no_speculation(model_path, baseline, mode):
    _, stats = run_all(
        EngineConfig(model=model_path, spec=mode, **EXACT), SamplingParams(temperature=0, max_tokens=80), baseline
    )
    assert stats.accepted <= stats.drafted
    if mode == "ngram":  # auto drafts as measured timings decide: on a loaded machine, once not at all in 240 tokens
        assert stats.drafted > 0 and stats.accepted > 0


def test_greedy_draft_model_speculation_equals_no_speculation(model_path, baseline):
    config = EngineConfig(model=model_path, spec="draft", draft_model=model_path, **EXACT)
    _, stats = run_all(config, SamplingParams(temperature=0, max_tokens=80), baseline)
    # The draft is the target itself: every confident draft is accepted.
    assert stats.drafted > 0 and stats.accepted / stats.drafted > 0.9


@pytest.mark.parametrize("flash_attn", ["on", "off"])
def test_seeded_sampling_gives_the_same_tokens_with_speculation_on_or_off(model_path, flash_attn):
    # Sample-and-match draws every emitted token from the stream's own seeded sampler, one draw
    # per token as without drafts, whatever was drafted or accepted.
    # No kept prefixes: with them, the second prompt (which reuses the first one's kept KV)
    # parts from spec off at token 3 (draft) or 15 (n-gram), with the sampler's draw landing
    # in another token's interval, not at an interval edge; the same prompts with fresh KV are
    # identical in all three modes. That is a kept-prefix matter for the engine (issue 12).
    # Flash attention on: its CPU kernel computes a decode row the same whatever else is in the
    # batch, so a verified draft row equals a plain step's row and seeded streams speculate.
    # With it off (auto on the CPU) rows round apart by batch shape, and a seeded draw could land
    # on the other side of an interval edge: there seeded streams decode plainly (unseeded ones
    # still speculate).
    params = SamplingParams(temperature=0.8, max_tokens=60, seed=42)
    fresh = {**EXACT, "cache_ram": 0, "flash_attn": flash_attn}
    off, _ = run_all(EngineConfig(model=model_path, spec="off", **fresh), params)
    for config in (
        EngineConfig(model=model_path, spec="ngram", **fresh),
        EngineConfig(model=model_path, spec="draft", draft_model=model_path, **fresh),
    ):
        outs, stats = run_all(config, params)
        gate.same_shapes(
            [o.token_ids for o in outs],
            [o.token_ids for o in off],
            f"seeded, {config.spec}: with flash attention on a verified draft row equals a plain step's row; "
            "with it off seeded streams draft nothing",
        )
        if flash_attn == "on":
            assert stats.drafted > 0 and stats.accepted > 0
    if flash_attn == "off":
        _, stats = run_all(config, params.model_copy(update={"seed": None}))
        assert stats.drafted > 0, "unseeded streams speculate"


@pytest.mark.parametrize("name", ["default", "gemma3-270m-q4_k_m"])
def test_a_context_claims_batch_invariance_only_where_a_verified_row_equals_a_plain_one(name):
    """Seeded streams speculate only on a context that claims a row's logits do not depend on its batch:
    there a verify chunk's rows must equal the same tokens decoded one at a time, bit for bit (else a seed
    gives other text with speculation on). Flash attention on, on the CPU: SmolLM2 claims it; Gemma 3, whose
    rows part, must not."""
    from edgeinfer.llamacpp import Batch, Context, ContextParams, Model
    from edgeinfer.models.catalog import resolve_model

    model = Model(resolve_model(name))
    ctx = Context(model, ContextParams(n_ctx=1024, n_seq_max=1, flash_attn="on"))
    try:
        prompt = model.vocab.tokenize("The quick brown fox jumps over the lazy dog. " * 8)
        chunk = model.vocab.tokenize(" The cat sat on the mat and", add_special=False)[:4]

        def decode(tokens: list[int], pos: int, all_logits: bool) -> list[np.ndarray]:
            batch = Batch(len(tokens))
            try:
                last = batch.add(0, tokens, pos, True, 0 if all_logits else -1)
                assert ctx.decode(batch)
                rows = range(last - len(tokens) + 1, last + 1) if all_logits else [last]
                return [ctx.logits(r).copy() for r in rows]
            finally:
                batch.close()

        decode(prompt, 0, False)
        alone = [decode([t], len(prompt) + i, False)[0] for i, t in enumerate(chunk)]
        ctx.seq_rm(0, len(prompt), -1)
        verified = decode(chunk, len(prompt), True)
        apart = [float(np.max(np.abs(a - v))) for a, v in zip(alone, verified, strict=True)]
        assert not ctx.batch_invariant or not any(apart), f"claimed invariant, yet rows {apart} apart"
        assert ctx.batch_invariant == (name == "default"), "SmolLM2 was measured invariant with flash attention on"
    finally:
        ctx.close()
        model.close()


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
        same_or_near_tie(want, cont, eng, longer)


def test_rejection_sampling_path_runs_and_counts(model_path):
    config = EngineConfig(model=model_path, spec="draft", draft_model=model_path, spec_verify="rejection", **EXACT)
    with make_engine(config) as eng:
        r = eng.generate(chat(eng, PROMPTS[2]), SamplingParams(temperature=0.7, max_tokens=40))
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
    gate.same_shapes(results[0].token_ids, results[1].token_ids, "greedy forks of one kept prefix, side by side")


# --- the output law at temperature > 0, on the real path ----------------------------------
# The drafter, its --draft-p-min cut-off and the verifier, with the default model drafting
# for itself. The prompt leaves the model sure of its next two tokens (" is", " Paris") and
# unsure of the third ("." about 0.59, "," about 0.41 at temperature 0.8). A stream's first
# token comes from the plain path; its draft then covers tokens 2 and 3, so token 3 is where
# a cut-off that looks at the drafted token itself (stop when q(x) < p_min) skews the law:
# "," is then drafted only to be cut, and "." comes out about 0.59 + 0.41 * 0.59 = 0.83.
CAPITAL = ("What is the capital of France?", "The capital of France")
HOT = SamplingParams(temperature=0.8, max_tokens=4)
N_LAW = 120  # seeded requests: that 0.24 shift is about 5 standard errors (chi-square's 0.001 cut: 3.3)
CHI2_001 = (10.83, 13.82, 16.27, 18.47, 20.52)  # chi-square critical values at 0.001, by degrees of freedom


def third_token_law(eng: Engine, prompt: list[int]) -> tuple[list[int], dict[int, float]]:
    """The target's own law of token 3 after its likely first two, from its logits (no drafts).

    logprobs disables speculation for the request; its top 20 cover what top-k/top-p/min-p keep.
    """
    ref = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=3, logprobs=20))
    top = ref.logprobs[2].top
    logits = np.array([lp for _, _, lp in top])
    assert np.exp(logits).sum() > 0.99, "the top 20 miss mass the sampler could keep"
    probs = sampling_probs(logits, HOT.temperature, HOT.top_k, HOT.top_p, HOT.min_p)
    return ref.token_ids[:2], {t: float(p) for (t, _, _), p in zip(top, probs, strict=True) if p > 0}


def chi_square(counts: Counter, law: dict[int, float], min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's goodness-of-fit statistic and its degrees of freedom; rare outcomes are pooled."""
    n = sum(counts.values())
    cells = [[counts[t], n * p] for t, p in sorted(law.items(), key=lambda kv: -kv[1]) if n * p >= min_expected]
    kept = {t for t, p in law.items() if n * p >= min_expected}
    rest = [sum(c for t, c in counts.items() if t not in kept), n - sum(e for _, e in cells)]
    if rest[1] >= min_expected:
        cells.append(rest)
    else:  # too rare to test alone: pooled with the least likely kept outcome
        cells[-1] = [cells[-1][0] + rest[0], cells[-1][1] + rest[1]]
    return sum((o - e) ** 2 / e for o, e in cells), len(cells) - 1


@pytest.mark.parametrize("verify", ["match", "rejection"])
def test_draft_speculation_keeps_the_output_law_at_temperature(model_path, verify):
    config = EngineConfig(
        model=model_path,
        spec="draft",
        draft_model=model_path,
        spec_verify=verify,
        parallel=16,
        max_queue=N_LAW,
        flash_attn="on",  # the law comes from a 3-token run's logits: rows that do not round by batch shape
        ctx_size=16 * 512,  # 512 cells a stream hold the prompt and 4 tokens (8,192 each take 10 s to allocate)
    )
    with make_engine(config) as eng:
        prompt = eng.chat_prompt([{"role": "user", "content": CAPITAL[0]}])
        prompt += eng.vocab.tokenize(CAPITAL[1], False, False)
        prefix, law = third_token_law(eng, prompt)
        handles = [eng.submit(prompt, HOT.model_copy(update={"seed": s}))[0] for s in range(N_LAW)]
        outs = [h.result().token_ids for h in handles]
        stats = eng.snapshot().spec
    assert stats.error is None and stats.drafted_at[1] > N_LAW / 2  # token 3 was drafted, mostly
    third = Counter(t[2] for t in outs if t[:2] == prefix)
    assert sum(third.values()) > 0.8 * N_LAW  # the first two are as sure as the prompt meant
    stat, df = chi_square(third, law)
    assert 1 <= df <= len(CHI2_001)
    assert stat < CHI2_001[df - 1], f"chi-square {stat:.1f} on {df} df: law {law}, seen {third.most_common(4)}"


def test_draft_model_keeps_speculating_over_many_requests(model_path):
    # A small context: were the draft model's sequences kept after their streams end, its KV
    # would fill after a few rounds and speculation would turn off for the engine's life.
    config = EngineConfig(model=model_path, spec="draft", draft_model=model_path, parallel=4, ctx_size=1024)
    params = SamplingParams(temperature=0, max_tokens=48)
    drafted = [0]
    with make_engine(config) as eng:
        for r in range(4):
            asks = [chat(eng, f"Round {r}, question {i}: what is {i + r} times {i + 3}?") for i in range(4)]
            for h in [eng.submit(a, params)[0] for a in asks]:
                h.result()
            stats = eng.snapshot().spec
            assert stats.error is None, f"round {r}: {stats.error}"
            drafted.append(stats.drafted)
        assert (
            eng.speculator is not None and not eng.speculator.drafter.drafts.held
        )  # every ended stream's sequence is gone
    assert all(b > a for a, b in pairwise(drafted)), drafted


@pytest.mark.parametrize("layout", ["per-seq", "unified"])
def test_streams_of_one_prompt_copy_its_draft_prefix_instead_of_computing_it_again(model_path, layout):
    """Four choices of one prompt: the draft model computes the prompt once and copies it to the other
    three sequences (as the target forks its kept prefix), so its catch-up costs one prompt, not four."""
    config = EngineConfig(
        model=model_path, spec="draft", draft_model=model_path, parallel=4, ctx_size=4096, kv_layout=layout
    )
    params = SamplingParams(temperature=0.8, max_tokens=12)  # unseeded: seeded streams draft only with flash attention
    with make_engine(config) as eng:
        prompt = chat(eng, code_edit_prompt(0))
        results = [h.result() for h in eng.submit(prompt, params, n=4)]
        assert eng.speculator is not None
        computed = eng.speculator.drafter.drafts.computed
        stats = eng.snapshot().spec
    assert all(r.stats.completion_tokens == 12 or r.finish_reason == "stop" for r in results)
    assert stats.error is None and stats.drafted > 0
    # Without the copies: at least 4 x the prompt. With them: the prompt once, and each stream's tokens.
    assert len(prompt) <= computed < len(prompt) + 4 * 2 * 12, (computed, len(prompt))


def test_verified_drafts_never_pick_a_token_ignore_eos_bans(model_path):
    """Greedy verification reads the target's pick through the stream's sampler: with ignore_eos no end of
    turn is accepted or emitted, drafted or not (llama-server's meaning)."""
    with make_engine(EngineConfig(model=model_path, spec="ngram", **EXACT)) as eng:
        prompt = chat(eng, "Say hello.")
        assert eng.generate(prompt, SamplingParams(temperature=0, max_tokens=160)).finish_reason == "stop"
        r = eng.generate(prompt, SamplingParams(temperature=0, max_tokens=160, ignore_eos=True))
        stats = eng.snapshot().spec
    assert r.finish_reason == "length" and len(r.token_ids) == 160
    assert not [t for t in r.token_ids if eng.vocab.is_eog(t)]
    assert stats.drafted > 0
