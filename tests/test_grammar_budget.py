"""Constrained answers close within max_tokens: the closing path on real matchers, a model that never closes
held to its budget (the JSON battery and every family's tool-call grammar), free text left alone, and the
engine at temperature 0.8 with max_tokens from 24 up."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from edgeinfer.bench.battery import CASES, WEATHER, check, schema_text
from edgeinfer.engine.grammar import Grammars
from edgeinfer.engine.grammar_budget import rank_of
from edgeinfer.errors import RequestError
from edgeinfer.formats.base import ToolSpec
from edgeinfer.formats.hermes import Hermes
from edgeinfer.formats.llama3 import Llama3
from edgeinfer.formats.mistral import Mistral
from edgeinfer.formats.qwen3_coder import Qwen3Coder
from edgeinfer.llamacpp.core import Model
from edgeinfer.options import Grammar, SamplingParams

from .gate import chat

pytestmark = pytest.mark.model

BUDGETS = (24, 32, 48)
TOOLS = [
    ToolSpec(WEATHER["function"]["name"], None, WEATHER["function"]["parameters"]),  # type: ignore[index]
    ToolSpec(
        "book_table",
        "Book a restaurant table.",
        {
            "type": "object",
            "properties": {
                "restaurant": {"type": "string", "maxLength": 40},
                "people": {"type": "integer", "minimum": 1, "maximum": 12},
                "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
            },
            "required": ["restaurant", "people", "time"],
        },
    ),
]
PARAMS = {t.name: t.parameters for t in TOOLS}


@pytest.mark.pure
def test_ranks_put_ends_before_fillers():
    """A quote ends a string, brackets close, whole values fill, `,` moves on; signs, openers and spaces last."""
    order = [b'""', b'"}', b'"', b"]}", b"}", b"null", b", ", b"1", b"0", b"7", b"abc", b"\\u", b"-", b"\n", b""]
    ranks = [rank_of(p) for p in order]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks), list(zip(order, ranks, strict=True))
    assert rank_of(b' ""') > rank_of(b'"') and rank_of(b" null") > rank_of(b", ")  # the separator rides along
    assert rank_of(b"") == -1


# --- on the default model's vocabulary ------------------------------------------------------------


@pytest.fixture(scope="module")
def grammars(model_path):
    model = Model(model_path)
    yield Grammars(model.vocab)
    model.close()


def json_grammar(case) -> Grammar:
    return Grammar(kind="json_schema", source=schema_text(case))


def lark(source: str) -> Grammar:
    return Grammar.model_construct(kind="lark", source=source, origin="tools")


def rambler(vocab, seed: int):
    """A model that never wants to end: letters and digits wherever they are allowed (inside a string, a
    number), else any allowed token but the end of text, at random."""
    rng = random.Random(seed)
    words = np.array([bool(p) and p.strip().isalnum() for p in (vocab.piece(t) for t in range(vocab.n_tokens))])

    def choose(allowed: np.ndarray, out: list[int]) -> int:
        allowed = allowed.copy()
        allowed[vocab.eos] = False
        ids = np.flatnonzero(allowed & words)
        return int(rng.choice(ids if len(ids) else np.flatnonzero(allowed)))

    return choose


def writer(vocab, text: str):
    """A model that wants to write `text` (what the grammar forced counts as written), then to end."""

    def choose(allowed: np.ndarray, out: list[int]) -> int:
        done = vocab.detokenize(out)
        assert text.startswith(done), f"the grammar wrote {done!r}"
        rest = text[len(done) :]
        token = vocab.tokenize(rest, add_special=False)[0] if rest else vocab.eos
        assert allowed[token], f"the grammar refuses {vocab.piece(token)!r} after {done!r}"
        return token

    return choose


def drive(grammars, grammar: Grammar, choose, budget: int):
    """Run a grammar state as the engine does with a stand-in model: (the text, its token count, how it ended,
    the grammar state).
    Ended: "stop" (end of text), "length" (the budget, as the Emitter cuts it: up to the token that reaches it)."""
    guide = grammars.states(grammars.compile(grammar), 1)[0]
    vocab, out = grammars.vocab, []
    while True:
        for t in guide.step(lambda: choose(guide.allowed(), out), lambda t: None, budget - len(out)):
            if t == guide.eos:
                return vocab.detokenize(out), len(out), "length" if guide.steered else "stop", guide
            out.append(t)
            if len(out) >= budget:
                return vocab.detokenize(out), len(out), "length", guide


def test_the_closing_path_is_a_valid_answer_from_the_start(grammars):
    """The shortest answer the path finds, for each schema: it parses, validates, and is what shortest() counts."""
    for case in CASES:
        compiled = grammars.compile(json_grammar(case))
        n = grammars.shortest(compiled)
        assert n is not None and n <= 60, (case.name, n)
        text, used, how, guide = drive(grammars, json_grammar(case), rambler(grammars.vocab, 0), n)
        assert check(case, text) is None, (case.name, text)
        assert used == n and how == "length" and guide.steered, (case.name, used, n, how)


def test_a_model_that_never_closes_is_held_to_every_budget(grammars):
    """Each battery schema, a rambling model, budgets from 24 up (or the schema's shortest answer when longer):
    every answer parses and validates, and ends within its budget."""
    problems = []
    for i, case in enumerate(CASES):
        shortest = grammars.shortest(grammars.compile(json_grammar(case)))
        assert shortest is not None
        for budget in sorted({max(b, shortest) for b in (24, 48)}):
            text, used, how, _ = drive(grammars, json_grammar(case), rambler(grammars.vocab, i), budget)
            if used > budget or check(case, text) is not None:
                problems.append((case.name, budget, used, how, check(case, text), text))
    assert problems == []


@pytest.mark.parametrize("family", [Hermes, Llama3, Mistral, Qwen3Coder], ids=lambda f: f.name)
def test_tool_call_grammars_close_within_the_budget(grammars, family):
    """Forced calls in each family's syntax (Lark with %json inside), a rambling model, tight budgets: the calls
    parse back and their arguments validate."""
    fmt = family(TOOLS)
    source = fmt.grammar(TOOLS, required=True, parallel=False, answer=fmt.answer_rule(None))
    shortest = grammars.shortest(grammars.compile(lark(source)))
    assert shortest is not None
    for seed, budget in enumerate((shortest, shortest + 6, 48)):
        text, used, _, _ = drive(grammars, lark(source), rambler(grammars.vocab, seed), max(budget, shortest))
        _, calls = fmt.parse(text, final=True)
        assert len(calls) == 1, (budget, text)
        jsonschema.validate(json.loads(calls[0].arguments), PARAMS[calls[0].name])
        assert used <= max(budget, shortest)


def test_free_text_is_cut_as_before_and_a_late_call_is_not_begun(grammars):
    """Under tool_choice auto, text may end anywhere: a long answer is cut at the budget, not steered. A call
    opened when it can no longer close is refused: the answer ends there (length), with no half call."""
    fmt = Hermes(TOOLS)
    source = fmt.grammar(TOOLS, required=False, parallel=False, answer=fmt.answer_rule(None))
    prose = "It is sunny in Paris today, with a light wind from the west and no rain expected. " * 2
    text, used, how, guide = drive(grammars, lark(source), writer(grammars.vocab, prose), 20)
    assert used == 20 and how == "length" and not guide.steered and prose.startswith(text)
    late = "It is sunny. <tool_call>\n"
    n_late = len(grammars.vocab.tokenize(late, add_special=False))  # the opening's last token comes with 3 left
    text, used, how, guide = drive(grammars, lark(source), writer(grammars.vocab, late), n_late + 2)
    assert how == "length" and guide.steered and "<tool_call>" not in text, text
    assert fmt.parse(text, final=True)[1] == []


def test_an_answer_the_model_ends_itself_is_not_steered(grammars):
    """Within the window but with room to spare: the model's own tokens, its own end, finish_reason stop."""
    case = next(c for c in CASES if c.name == "person")
    answer = '{"name": "Ada", "age": 36}'
    text, used, how, guide = drive(grammars, json_grammar(case), writer(grammars.vocab, answer), 24)
    assert (text, how, guide.steered) == (answer, "stop", False)
    assert used < 24


# --- the engine, at temperature 0.8 ---------------------------------------------------------------


def test_the_battery_validates_at_every_budget_from_24(engine):
    """Every schema of the battery at max_tokens 24, and half of them each at 32 and 48 (or the schema's shortest
    answer when longer), temperature 0.8, seeds apart, all in one batch: every answer parses and validates; some
    were steered closed (length), some ended freely (stop)."""
    grammars = engine.grammars
    handles = []
    for i, case in enumerate(CASES):
        shortest = grammars.shortest(grammars.compile(json_grammar(case)))
        assert shortest is not None
        for budget in (24, BUDGETS[1 + i % 2]):
            most = max(budget, shortest)
            params = SamplingParams(grammar=json_grammar(case), temperature=0.8, seed=budget + i, max_tokens=most)
            handles += [(case, budget, h) for h in engine.submit(chat(engine, case.prompt), params)]
    problems, reasons = [], []
    for case, budget, h in handles:
        f = h.result()
        reasons.append(f.finish_reason)
        if check(case, f.text) is not None or f.finish_reason not in ("stop", "length"):
            problems.append((budget, case.name, f.finish_reason, check(case, f.text), f.text))
    assert problems == []
    assert "length" in reasons and "stop" in reasons  # held to the budget, and free where there was room


def test_a_forced_tool_call_with_a_tight_budget_validates(engine):
    """tool_choice required in Hermes syntax, four streams at temperature 0.8, max_tokens a few tokens above the
    shortest call: each call parses and its arguments validate."""
    fmt = Hermes(TOOLS)
    grammar = lark(fmt.grammar(TOOLS, required=True, parallel=False, answer=fmt.answer_rule(None)))
    budget = engine.grammars.shortest(engine.grammars.compile(grammar)) + 4
    prompt = chat(engine, "What's the weather in Lyon? Call a tool.")
    params = SamplingParams(grammar=grammar, temperature=0.8, seed=7, max_tokens=budget)
    for h in engine.submit(prompt, params, n=4):
        f = h.result()
        _, calls = fmt.parse(f.text, final=True)
        assert len(calls) == 1 and f.stats.completion_tokens <= budget, f.text
        jsonschema.validate(json.loads(calls[0].arguments), PARAMS[calls[0].name])


def test_a_raw_text_value_closes_at_its_tag(grammars):
    """Qwen3-Coder writes a plain string as raw text, where a quote is text too: the path ends the value by
    writing its closing tag, so a rambling model's call still parses and validates within the budget."""
    edit = ToolSpec(
        "write_file",
        None,
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
            "required": ["path"],
        },
    )
    fmt = Qwen3Coder([edit])
    source = fmt.grammar([edit], required=True, parallel=False, answer=fmt.answer_rule(None))
    shortest = grammars.shortest(grammars.compile(lark(source)))
    assert shortest is not None
    for seed, budget in enumerate((shortest, shortest + 6, 48)):
        budget = max(budget, shortest)
        text, used, _, _ = drive(grammars, lark(source), rambler(grammars.vocab, seed), budget)
        _, calls = fmt.parse(text, final=True)
        assert len(calls) == 1 and used <= budget, (budget, text)
        jsonschema.validate(json.loads(calls[0].arguments), edit.parameters)


def test_each_grammar_is_compiled_once(grammars, monkeypatch):
    """An agent's tools come every turn: the same grammar is compiled once, a failing one is refused every time."""
    calls = []
    compile_ = grammars._compile
    monkeypatch.setattr(grammars, "_compile", lambda g: calls.append(g.source) or compile_(g))
    schema = json.dumps({"type": "object", "properties": {"once": {"type": "integer"}}, "required": ["once"]})
    first = grammars.compile(Grammar(kind="json_schema", source=schema))
    assert grammars.compile(Grammar(kind="json_schema", source=schema, origin="tools[0]")) == first
    assert calls == [schema]
    bad = Grammar(kind="regex", source="(unclosed")
    for _ in range(2):
        with pytest.raises(RequestError):
            grammars.compile(bad)
    assert calls == [schema, "(unclosed", "(unclosed"]
