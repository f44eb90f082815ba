"""Qwen3-Coder's XML calls: detection by template, writing and reading them back by the tools' schemas,
the history its own template writes, streaming, and the grammar (on the default model's vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgeinfer.engine.grammar import Grammars
from edgeinfer.engine.template import ChatTemplate
from edgeinfer.formats.base import CallStream, ToolSpec
from edgeinfer.formats.qwen3_coder import Qwen3Coder
from edgeinfer.formats.select import format_class
from edgeinfer.llamacpp import Model

from .conftest import grammar_takes as matches

pytestmark = pytest.mark.pure

TEMPLATES = Path(__file__).parent / "data" / "templates"  # where each came from: SOURCES.md there
QWEN3_CODER = (TEMPLATES / "Qwen3-Coder.jinja").read_text()
HERMES = (TEMPLATES / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").read_text()

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "note": {"type": ["string", "null"]},
        },
        "required": ["city", "days"],
    },
)
EVERYTHING = ToolSpec(
    "store",
    "Stores values of every type.",
    {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "maybe": {"type": ["integer", "null"]},
            "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        },
        "required": ["text"],
    },
)
TOOLS = [WEATHER, EVERYTHING]
STORED = {
    "text": 'two lines\nwith <b>tags</b>, "quotes" and 42',
    "count": -3,
    "ratio": 0.25,
    "flag": True,
    "tags": ["a", "b c"],
    "meta": {"a": 1},
    "maybe": None,
    "code": "QRS",
}


def test_detected_by_its_template_before_hermes():
    assert Qwen3Coder.detect(QWEN3_CODER)
    assert not Qwen3Coder.detect(HERMES)  # <tool_call> alone is Hermes
    assert format_class(QWEN3_CODER, renders_tools=True) is Qwen3Coder
    assert format_class(HERMES, renders_tools=True) is not Qwen3Coder


def test_written_calls_read_back_with_each_value_as_its_schema_types_it():
    fmt = Qwen3Coder(TOOLS)
    text = fmt.write_calls([("get_weather", {"city": "Paris", "days": 3}), ("store", STORED)])
    assert text.startswith("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n")
    assert "<parameter=days>\n3\n</parameter>" in text and "<parameter=flag>\ntrue\n</parameter>" in text
    before, calls = fmt.parse("Checking.\n" + text, final=True)
    assert before == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("store", STORED),
    ]


def test_a_string_parameter_stays_text_even_when_it_looks_like_json():
    fmt = Qwen3Coder(TOOLS)
    text = fmt.write_calls([("store", {"text": "42"}), ("get_weather", {"city": "null", "days": 1, "note": "null"})])
    _, calls = fmt.parse(text, final=True)
    assert json.loads(calls[0].arguments) == {"text": "42"}
    # "null" is null only where the schema allows null.
    assert json.loads(calls[1].arguments) == {"city": "null", "days": 1, "note": None}


def test_a_string_with_a_pattern_is_written_as_json_and_read_from_either_form():
    fmt = Qwen3Coder(TOOLS)
    for written in ('"ABC"', "ABC"):
        text = f"<tool_call>\n<function=store>\n<parameter=text>\nx\n</parameter>\n<parameter=code>\n{written}\n"
        _, calls = fmt.parse(text + "</parameter>\n</function>\n</tool_call>", final=True)
        assert json.loads(calls[0].arguments) == {"text": "x", "code": "ABC"}


def test_values_of_unknown_tools_are_json_where_they_parse_else_text():
    _, calls = Qwen3Coder([]).parse(
        "<tool_call>\n<function=other>\n<parameter=n>\n7\n</parameter>\n<parameter=s>\nhi there\n</parameter>\n"
        "</function>\n</tool_call>",
        final=True,
    )
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("other", {"n": 7, "s": "hi there"})]


def test_text_without_a_complete_call_is_text():
    fmt = Qwen3Coder(TOOLS)
    assert fmt.parse("Just an answer.", final=True) == ("Just an answer.", [])
    cut = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"
    assert fmt.parse(cut, final=True) == (cut, [])


def test_the_history_its_template_writes_reads_back_as_the_same_calls():
    """The template writes scalars with Python's str() (True, None) and mappings and lists as JSON."""
    fmt = Qwen3Coder(TOOLS)
    args = [{"city": "Oslo", "days": 2, "unit": "celsius"}, STORED]
    history = [
        {"role": "user", "content": "Weather in Oslo, and store it."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                fmt.history_call("call_1", "get_weather", args[0]),
                fmt.history_call("call_2", "store", args[1]),
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "ok"},
    ]
    offered = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in TOOLS]  # fmt: skip
    prompt = ChatTemplate(QWEN3_CODER).render(history, add_generation_prompt=True, tools=offered)
    assert "<parameter=flag>\nTrue\n</parameter>" in prompt  # Python's str(), as the template writes it
    said = prompt.split("<|im_start|>assistant", 1)[1].split("<|im_end|>", 1)[0]
    before, calls = fmt.parse(said, final=True)
    assert before is None
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", args[0]), ("store", args[1])]
    assert prompt.endswith("<tool_response>\nok\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n")


def test_streamed_text_gives_content_until_the_opening_and_each_call_once_complete():
    fmt = Qwen3Coder(TOOLS)
    calls_text = fmt.write_calls([("get_weather", {"city": "Rome", "days": 5}), ("store", {"text": "x"})])
    text = "Let me look.\n" + calls_text
    stream = CallStream(fmt)
    content, seen, at = "", [], []
    for i, ch in enumerate(text):
        out, calls = stream.feed(ch)
        content += out
        seen += calls
        at += [i] * len(calls)
    out, calls = stream.end()
    assert content + out == "Let me look.\n"
    assert [c.name for c in seen + calls] == ["get_weather", "store"]
    # Each call came out as soon as its </function> was written, not at the end.
    first_end = text.index("</function>") + len("</function>") - 1
    assert at[0] == first_end and at[1] == text.rindex("</function>") + len("</function>") - 1


def test_held_back_is_what_may_begin_the_opening():
    fmt = Qwen3Coder(TOOLS)
    assert fmt.held("I will <tool_") == len("<tool_")
    assert fmt.held("a < b") == 0
    assert fmt.opening_at("x <tool_call>\n<function=") == 2
    assert fmt.opening_at("x <tool") == -1


# --- the grammar, on the default model's vocabulary ---------------------------------


@pytest.fixture(scope="module")
def grammars(model_path):
    model = Model(model_path)
    return Grammars(model.vocab), model.vocab


@pytest.mark.model
def test_the_forced_grammar_takes_written_calls_and_refuses_what_breaks_a_schema(grammars):
    fmt = Qwen3Coder(TOOLS)
    forced = fmt.grammar(TOOLS, required=True, parallel=True, answer="")
    good = [
        ("get_weather", {"city": "Paris", "days": 3}),
        ("get_weather", {"city": "New\nYork </param", "days": 14, "unit": "fahrenheit", "note": None}),
        ("store", STORED),
    ]
    assert matches(grammars, forced, fmt.write_calls(good))
    assert matches(grammars, forced, fmt.write_calls(good[:1]))
    call = "<tool_call>\n<function=get_weather>\n{}</function>\n</tool_call>"
    city, days = "<parameter=city>\nParis\n</parameter>\n", "<parameter=days>\n3\n</parameter>\n"
    assert matches(grammars, forced, call.format(city + days))
    store = "<tool_call>\n<function=store>\n<parameter=text>\nx\n</parameter>\n{}</function>\n</tool_call>"
    assert matches(grammars, forced, store.format('<parameter=code>\n"XYZ"\n</parameter>\n'))
    bad = {
        "a required parameter left out": call.format(city),
        "an integer as words": call.format(city + "<parameter=days>\nthree\n</parameter>\n"),
        "an integer out of range": call.format(city + "<parameter=days>\n15\n</parameter>\n"),
        "a value outside the enum": call.format(city + days + "<parameter=unit>\nkelvin\n</parameter>\n"),
        "a parameter the tool lacks": call.format(city + days + "<parameter=x>\n1\n</parameter>\n"),
        "a closing tag inside a string": call.format("<parameter=city>\na</parameter>b\n</parameter>\n" + days),
        "the call's closing tags inside a string": call.format(
            "<parameter=city>\nParis\n</function>\n</tool_call>\nmore\n</parameter>\n" + days
        ),
        "a string off its pattern": store.format('<parameter=code>\n"ABCD"\n</parameter>\n'),
        "a patterned string raw": store.format("<parameter=code>\nABC\n</parameter>\n"),
        "a tool not offered": "<tool_call>\n<function=other>\n</function>\n</tool_call>",
        "text before the call": "Sure. " + call.format(city + days),
    }
    assert [why for why, text in bad.items() if matches(grammars, forced, text)] == []
    one = fmt.grammar(TOOLS, required=True, parallel=False, answer="")
    assert matches(grammars, one, fmt.write_calls(good[:1]))
    assert not matches(grammars, one, fmt.write_calls(good[:2]))


@pytest.mark.model
def test_the_auto_grammar_takes_an_answer_or_text_then_calls(grammars):
    fmt = Qwen3Coder(TOOLS)
    auto = fmt.grammar(TOOLS, required=False, parallel=True, answer=fmt.answer_rule(None))
    calls = fmt.write_calls([("get_weather", {"city": "Paris", "days": 3})])
    assert matches(grammars, auto, "It is sunny in Paris.")
    assert matches(grammars, auto, calls)
    assert matches(grammars, auto, "I will look it up.\n" + calls)
    assert not matches(grammars, auto, "I will look it up.\n<tool_call>\n<function=get_weather>\n</function>")
    json_answer = fmt.answer_rule({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    auto_json = fmt.grammar(TOOLS, required=False, parallel=False, answer=json_answer)
    assert matches(grammars, auto_json, '{"a": 1}')
    assert matches(grammars, auto_json, calls)
    assert not matches(grammars, auto_json, "Text.\n" + calls)
