"""Constrained decoding in the engine: every answer valid, packed with free streams, forced tokens riding along."""

from __future__ import annotations

import json

import pytest

from edgeinfer.bench.battery import CASES, check, schema_text
from edgeinfer.engine.grammar import closed
from edgeinfer.errors import RequestError
from edgeinfer.options import EngineConfig, Grammar, SamplingParams
from edgeinfer.runtime import make_engine

from . import gate
from .gate import chat

pytestmark = pytest.mark.model


def schema_params(case, **kw) -> SamplingParams:
    return SamplingParams(grammar=Grammar(kind="json_schema", source=schema_text(case)), **kw)


def steps_of(engine, fn):
    """Run fn() and return (its result, the engine steps it took)."""
    before = engine.metrics.steps
    out = fn()
    return out, engine.metrics.steps - before


def test_every_battery_answer_validates_packed_with_free_streams(engine):
    """All 26 schemas at temperature 0.8, n from 1 to 4, in the same batches as unconstrained streams."""
    free = engine.submit(chat(engine, "Tell me a story."), SamplingParams(temperature=0.8, max_tokens=64), n=2)
    handles = []
    for i, case in enumerate(CASES):
        n = 1 + i % 4
        prompt = chat(engine, case.prompt + " Answer in JSON.")
        handles += [(case, h) for h in engine.submit(prompt, schema_params(case, temperature=0.8, max_tokens=300), n)]
    problems = []
    for case, h in handles:
        f = h.result()
        err = check(case, f.text)
        if err or f.finish_reason != "stop":
            problems.append((case.name, f.finish_reason, err, f.text[:120]))
    assert problems == []
    assert len(handles) == sum(1 + i % 4 for i in range(len(CASES)))
    assert all(h.result().finish_reason in ("stop", "length") and h.result().text for h in free)


def test_forced_tokens_ride_along_without_a_step_each(engine):
    """Fixed keys are appended at once: the answer has more tokens than the steps that made it."""
    case = next(c for c in CASES if c.name == "long_keys")
    prompt = chat(engine, case.prompt)
    f, steps = steps_of(engine, lambda: engine.generate(prompt, schema_params(case, temperature=0, max_tokens=200)))
    assert check(case, f.text) is None, f.text
    # Prompt chunks take a step too; every key here is ~8 forced tokens.
    assert f.stats.completion_tokens >= steps + 20, (f.stats.completion_tokens, steps)


def test_greedy_constrained_text_is_reproducible_and_warm_from_the_cache(engine):
    case = next(c for c in CASES if c.name == "invoice")
    prompt = chat(engine, case.prompt)
    cold = engine.generate(prompt, schema_params(case, temperature=0, max_tokens=300))
    warm = [engine.generate(prompt, schema_params(case, temperature=0, max_tokens=300)) for _ in range(2)]
    # The cold run computes the prompt's last token in the prompt's batch, a warm one alone: they may part at
    # a near-tie, and both are valid. Two warm runs find the cache in the same state, and a grammar's stream
    # drafts nothing, so their batches are the same shapes.
    assert check(case, cold.text) is None and check(case, warm[0].text) is None
    assert warm[0].stats.cached_tokens > 0
    gate.same_shapes(warm[0].token_ids, warm[1].token_ids, "greedy, warm from the cache in the same state, no drafts")


def test_lark_and_regex_grammars(engine):
    prompt = chat(engine, "Is the sky blue?")
    lark = Grammar(kind="lark", source='start: ("yes" | "no") "." ')
    f = engine.generate(prompt, SamplingParams(temperature=0.8, max_tokens=20, grammar=lark))
    gate.allowed(f.text, ("yes.", "no."))
    assert f.finish_reason == "stop"
    regex = Grammar(kind="regex", source=r"[0-9]{3}-[0-9]{4}")
    f = engine.generate(chat(engine, "A phone number?"), SamplingParams(temperature=0.8, max_tokens=20, grammar=regex))
    gate.fits(f.text, r"[0-9]{3}-[0-9]{4}")


WHEN = {
    "type": "object",
    "properties": {
        "day": {"type": "string", "format": "date"},
        "starts": {"type": "string", "format": "time"},
        "stamp": {"type": "string", "format": "date-time"},
    },
    "required": ["day", "starts", "stamp"],
}


def test_dates_and_times_are_real_at_a_high_temperature(engine):
    """The defect: at temperature 0.8 the grammar let "2023-02-29" through. 32 answers at temperature 1.2
    (16 seeds, 2 streams each), every value checked by jsonschema's format checker (with rfc3339-validator)."""
    import jsonschema

    prompt = chat(engine, "When is the next leap day, when does the party start, and when exactly? Answer in JSON.")
    grammar = Grammar(kind="json_schema", source=json.dumps(WHEN), origin="response_format")
    handles = [
        h
        for seed in range(16)
        for h in engine.submit(prompt, SamplingParams(temperature=1.2, seed=seed, max_tokens=100, grammar=grammar), 2)
    ]
    answers = [h.result() for h in handles]
    check_formats = jsonschema.Draft202012Validator(WHEN, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    bad = [(a.text, [e.message for e in check_formats.iter_errors(json.loads(a.text))]) for a in answers]
    assert [b for b in bad if b[1]] == []
    assert len(answers) == 32 and all(a.finish_reason in ("stop", "length") for a in answers)
    assert len({a.text for a in answers}) > 8  # the seeds drew different values


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "array", "uniqueItems": True}, ["'uniqueItems'", "at /"]),
        ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, ["'not'", "/properties/a"]),
        ({"type": "strin"}, ["not a valid JSON Schema", "/type"]),
        ({"$ref": "#/$defs/missing"}, ["cannot be enforced", "missing"]),
    ],
)
def test_schemas_that_cannot_be_enforced_are_refused_by_name(engine, schema, words):
    g = Grammar(kind="json_schema", source=json.dumps(schema), origin="response_format")
    with pytest.raises(RequestError) as e:
        engine.submit([1, 2, 3], SamplingParams(grammar=g))
    assert all(w in str(e.value) for w in words), str(e.value)
    assert e.value.param == "response_format"


def test_schema_text_and_nesting_are_bounded(engine):
    deep: dict = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    for source, words in [("{not json", "not valid JSON"), (json.dumps(deep), "levels deep"), ("[1, 2]", "object")]:
        with pytest.raises(RequestError, match=words):
            engine.submit([1, 2, 3], SamplingParams(grammar=Grammar(kind="json_schema", source=source)))
    with pytest.raises(RequestError, match="lark grammar is not valid"):
        engine.submit([1, 2, 3], SamplingParams(grammar=Grammar(kind="lark", source="start: nothing_here")))
    assert engine.generate("Hello", SamplingParams(max_tokens=4)).finish_reason in ("stop", "length")


@pytest.mark.pure
def test_closed_schema_answers_the_original():
    """The copy edgeinfer enforces is narrower, never wider: what it allows validates against the original."""
    s = {"type": "object", "properties": {"n": {"type": "number"}, "k": {"type": "integer", "minimum": 3}}}
    c = closed(s)
    assert c["additionalProperties"] is False
    assert c["properties"]["n"]["multipleOf"] == 1e-9 and c["properties"]["n"]["maximum"] == 2**53 - 1
    assert c["properties"]["k"]["minimum"] == 3 and "multipleOf" not in c["properties"]["k"]
    enum = {"enum": [{"properties": {}}]}
    assert closed(enum) == enum  # data is left alone
    assert s == {"type": "object", "properties": {"n": {"type": "number"}, "k": {"type": "integer", "minimum": 3}}}


def test_logit_bias_bans_and_favours_tokens(engine):
    prompt = chat(engine, "Name a color.")
    first = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=1)).token_ids[0]
    banned = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=1, logit_bias={first: -100}))
    gate.differ(banned.token_ids[0], first, "a bias of -100 bans that token")
    target = engine.tokenize("zebra", special=False)[-1]
    favoured = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=1, logit_bias={target: 100}))
    gate.ruled(favoured.token_ids[0], target, "a bias of +100 makes it the choice")


def test_constrained_streams_give_the_same_seeded_text_with_speculation_on_or_off(model_path, engine):
    """A grammar's stream does not draft (its forced tokens are its drafts): speculation cannot change it."""
    case = next(c for c in CASES if c.name == "tool_args")
    prompt = chat(engine, case.prompt)
    params = schema_params(case, temperature=0.8, seed=7, max_tokens=200)
    with make_engine(EngineConfig(model=model_path, parallel=8, ctx_size=4096, spec="ngram")) as spec:
        on = spec.generate(prompt, params)
        assert on.stats.draft_tokens == 0
    with make_engine(EngineConfig(model=model_path, parallel=8, ctx_size=4096, spec="off")) as plain:
        off = plain.generate(prompt, params)
    assert check(case, on.text) is None
    gate.same_shapes(on.token_ids, off.token_ids, "seeded; a grammar's stream drafts nothing, so the batches match")
