"""Llama 3.x's and Mistral's tool calls: detection by template, reading what real models write (whole and
streamed at every split), writing calls back, Mistral's call ids, the grammars (on the default model's
vocabulary), and, on the default model's weights with each family's real template, the prompt against
transformers' own rendering and forced calls at temperature 0.8 that all validate."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import jsonschema
import pytest

from edgeinfer.engine.grammar import Grammars
from edgeinfer.engine.template import ChatTemplate
from edgeinfer.events import Chunk
from edgeinfer.formats.base import Call, CallStream, ToolFormat, ToolSpec
from edgeinfer.formats.llama3 import Llama3
from edgeinfer.formats.mistral import Mistral
from edgeinfer.formats.select import format_class
from edgeinfer.llamacpp import Model
from edgeinfer.models.catalog import default_model_path
from edgeinfer.options import EngineConfig, Grammar, SamplingParams
from edgeinfer.runtime import make_engine

from .conftest import grammar_takes as matches

pytestmark = pytest.mark.pure

TEMPLATES = Path(__file__).parent / "data" / "templates"  # where each came from: SOURCES.md there
LLAMA33 = (TEMPLATES / "meta-llama-Llama-3.3-70B-Instruct.jinja").read_text()
LLAMA32 = (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
NEMO = (TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()
HERMES = (TEMPLATES / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").read_text()
QWEN3_CODER = (TEMPLATES / "Qwen3-Coder.jinja").read_text()

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "days"],
    },
)
ADD = ToolSpec(
    "add",
    "Adds two integers.",
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)
TOOLS = [WEATHER, ADD]
PARIS = {"city": "Paris", "days": 3}
NESTED = {"city": 'Zürich "old town"\n<b>', "days": 1, "unit": "celsius"}


def smollm2_template() -> str:
    """The default model's own template (it knows no tools), read from its GGUF's metadata."""
    field = gguf.GGUFReader(default_model_path()).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def args(call: Call) -> dict[str, Any]:
    return json.loads(call.arguments)


# --- detection ------------------------------------------------------------------------


def test_each_family_is_detected_by_its_own_template_only():
    smollm2 = smollm2_template()
    assert Llama3.detect(LLAMA33) and Llama3.detect(LLAMA32)
    assert Mistral.detect(NEMO)
    assert [t for t in (NEMO, HERMES, QWEN3_CODER, smollm2) if Llama3.detect(t)] == []
    assert [t for t in (LLAMA33, LLAMA32, HERMES, QWEN3_CODER, smollm2) if Mistral.detect(t)] == []
    # The selector picks them (these templates render tools); the later Mistral syntax is not this one.
    assert format_class(LLAMA33, renders_tools=True) is Llama3
    assert format_class(NEMO, renders_tools=True) is Mistral
    assert not Mistral.detect("{{ '[TOOL_CALLS]' + name + '[ARGS]' + arguments }}")


# --- Llama 3.x: reading calls ------------------------------------------------------------


def test_llama3_reads_a_call_however_real_models_write_it():
    fmt = Llama3(TOOLS)
    written = {
        "the template's form": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        "with the python tag": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        "arguments, not parameters": '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
        "spaced out": '\n  {\n "name" : "get_weather" ,\n "parameters" : {"city": "Paris", "days": 3}\n}\n',
        "typed": '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        "arguments as JSON text": '{"name": "get_weather", "parameters": "{\\"city\\": \\"Paris\\", \\"days\\": 3}"}',
    }
    for why, text in written.items():
        before, calls = fmt.parse(text, final=True)
        assert (before, [(c.name, args(c)) for c in calls]) == (None, [("get_weather", PARIS)]), why


def test_llama3_reads_several_calls_and_text_before_the_tag():
    fmt = Llama3(TOOLS)
    text = (
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
        '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    )
    _, calls = fmt.parse(text, final=True)
    assert [(c.name, args(c)) for c in calls] == [("get_weather", PARIS), ("add", {"a": 1, "b": 2})]
    before, calls = fmt.parse('Let me look.<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', final=True)
    assert before == "Let me look." and [c.name for c in calls] == ["add"]


def test_llama3_text_that_is_no_call_stays_text():
    fmt = Llama3(TOOLS)
    for text in [
        "It is sunny in Paris.",
        '{"answer": 42}',  # JSON, but not a call
        '{"name": "Bob", "age": 3}',  # begins like one, has no arguments
        'You could write {"name": "add", "parameters": {"a": 1, "b": 2}} yourself.',  # a call only at the start
        '{"name": "get_weather", "parameters": {"city": "Par',  # cut off
    ]:
        assert fmt.parse(text, final=True) == (text, []), text


def test_llama3_opening_and_what_is_held_back():
    fmt = Llama3(TOOLS)
    assert fmt.opening_at('{"name": "add"') == 0
    assert fmt.opening_at(' \n{ "type": "function", "name" :') == 2
    assert fmt.opening_at("Sure.<|python_tag|>{") == 5
    assert fmt.opening_at('{"names": 1}') == -1
    assert fmt.opening_at('Text {"name": "add"') == -1
    for maybe in ["", "  ", "{", '{"', '{"na', '{ "name" ', '{"type": "func']:
        assert fmt.held(maybe) == len(maybe), maybe  # may still be a call's beginning
    assert fmt.held('{"answer"') == 0
    assert fmt.held("Hello <|py") == len("<|py")
    assert fmt.held("a < b") == 0


# --- Mistral: reading calls and ids --------------------------------------------------------


def test_mistral_reads_calls_with_their_ids_however_spaced():
    fmt = Mistral(TOOLS)
    text = (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "id": "a1B2c3D4e"}, '
        '{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "Zz9Yy8Xx7"}]'
    )
    before, calls = fmt.parse(text, final=True)
    assert before is None
    assert [(c.name, args(c), c.id) for c in calls] == [
        ("get_weather", PARIS, "a1B2c3D4e"),
        ("add", {"a": 1, "b": 2}, "Zz9Yy8Xx7"),
    ]
    twice = text.replace("Zz9Yy8Xx7", "a1B2c3D4e")
    assert [c.id for c in fmt.parse(twice, final=True)[1]] == ["a1B2c3D4e", None]  # a repeated id: a new one later
    # SGLang's form (a space after the tag), no id, and text before: read too; a missing id stays None.
    before, calls = fmt.parse('Checking. [TOOL_CALLS] [ {"name": "add", "arguments": {"a": 1, "b": 2}} ]', final=True)
    assert before == "Checking." and [(c.name, c.id) for c in calls] == [("add", None)]
    for text in [
        "No calls here.",
        "[TOOL_CALLS][",
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1',
        "[TOOL_CALLS][1]",
    ]:
        assert fmt.parse(text, final=True) == (text, []), text


def test_mistral_ids_are_9_alphanumerics_and_a_client_id_maps_stably():
    fmt = Mistral(TOOLS)
    ids = {fmt.new_id() for _ in range(50)}
    assert len(ids) == 50 and all(re.fullmatch("[A-Za-z0-9]{9}", i) for i in ids)
    client = ["call_0123456789abcdef01234567", "toolu_01A09q90qw90lq917835lq9", "x", "call_1", "ünïcode-id"]
    mapped = [fmt.history_id(c) for c in client]
    assert all(re.fullmatch("[A-Za-z0-9]{9}", m) for m in mapped)
    assert len(set(mapped)) == len(client)
    assert mapped == [Mistral([]).history_id(c) for c in client]  # the same in every request
    assert fmt.history_id("a1B2c3D4e") == "a1B2c3D4e"  # already one the template takes
    # A call and its result match in the history: both go through history_id.
    assert fmt.history_call("call_1", "add", {"a": 1})["id"] == fmt.history_id("call_1")


# --- both: round trips and streaming --------------------------------------------------------


FAMILIES = [Llama3, Mistral]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_written_calls_read_back(family: type[ToolFormat]):
    fmt = family(TOOLS)
    calls = [("get_weather", NESTED), ("add", {"a": -1, "b": 2**40})]
    for some in (calls[:1], calls):
        before, got = fmt.parse(fmt.write_calls(some), final=True)
        assert before is None and [(c.name, args(c)) for c in got] == some
    if family is Mistral:
        _, got = fmt.parse(fmt.write_calls(calls), final=True)
        assert all(c.id and re.fullmatch("[A-Za-z0-9]{9}", c.id) for c in got)


def streamed(fmt: ToolFormat, pieces: list[str]) -> tuple[str, list[Call]]:
    stream = CallStream(fmt)
    content, calls = "", []
    for piece in pieces:
        text, new = stream.feed(piece)
        content, calls = content + text, calls + new
    text, new = stream.end()
    return content + text, calls + new


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_streamed_at_every_split_gives_the_same_content_and_calls(family: type[ToolFormat]):
    fmt = family(TOOLS)
    calls = fmt.write_calls([("get_weather", NESTED), ("add", {"a": 1, "b": 2})])
    prefix = "Let me check. " + ("<|python_tag|>" if family is Llama3 else "")
    for text in (calls, prefix + calls):
        want_before, want = fmt.parse(text, final=True)
        assert len(want) == 2
        for i in range(len(text) + 1):
            content, got = streamed(family(TOOLS), [text[:i], text[i:]])
            assert (content.strip() or None, got) == (want_before, want), (text, i)
        content, got = streamed(family(TOOLS), list(text))
        assert (content.strip() or None, got) == (want_before, want)
        # While streaming, a call is given out once complete, never a cut one.
        cut = text[: text.index('"add"') + 12]
        assert len(fmt.parse(cut, final=False)[1]) == 1


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_plain_text_streams_whole(family: type[ToolFormat]):
    for text in ["It is sunny.", "  { not json", '{"answer": 1}', "Prices [TOOL_CALLS are low <|python"]:
        for i in range(len(text) + 1):
            assert streamed(family(TOOLS), [text[:i], text[i:]]) == (text, []), (text, i)


# --- the history the templates write reads back ------------------------------------------------


def history(fmt: ToolFormat, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A conversation with earlier calls and their results, as the server hands it to the template."""
    ids = [f"call_{i}abcdef" for i in range(len(calls))]
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris, and 1 + 2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [fmt.history_call(i, n, a) for i, (n, a) in zip(ids, calls, strict=True)],
        },
        *[
            {"role": "tool", "content": json.dumps({"result": k}), "tool_call_id": fmt.history_id(i), "name": n}
            for k, (i, (n, _)) in enumerate(zip(ids, calls, strict=True))
        ],
    ]


def openai_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in tools
    ]


def written_back(fmt: ToolFormat, prompt: str, eos: str) -> str:
    """The first assistant turn of calls in a rendered prompt, as the template wrote it."""
    if isinstance(fmt, Llama3):
        return prompt.split("<|start_header_id|>assistant<|end_header_id|>\n\n")[1].split("<|eot_id|>")[0]
    start = prompt.index("[TOOL_CALLS]")
    return prompt[start : prompt.index(eos, start)]


def test_the_history_each_template_writes_reads_back_as_the_same_calls():
    llama = Llama3(TOOLS)
    prompt = ChatTemplate(LLAMA33, bos="<|begin_of_text|>").render(
        history(llama, [("get_weather", NESTED)]), tools=openai_tools(TOOLS)
    )
    answer = written_back(llama, prompt, "")
    assert answer == llama.write_calls([("get_weather", NESTED)])
    assert [(c.name, args(c)) for c in llama.parse(answer, final=True)[1]] == [("get_weather", NESTED)]

    mistral = Mistral(TOOLS)
    calls = [("get_weather", NESTED), ("add", {"a": 1, "b": 2})]
    prompt = ChatTemplate(NEMO, bos="<s>", eos="</s>").render(history(mistral, calls), tools=openai_tools(TOOLS))
    got = mistral.parse(written_back(mistral, prompt, "</s>"), final=True)[1]
    assert [(c.name, args(c), c.id) for c in got] == [
        (n, a, mistral.history_id(f"call_{i}abcdef")) for i, (n, a) in enumerate(calls)
    ]
    # Each result names its call's (mapped) id, so the model can tell them apart.
    assert f'"call_id": "{mistral.history_id("call_1abcdef")}"}}[/TOOL_RESULTS]' in prompt


def test_the_templates_refuse_what_they_cannot_take():
    from edgeinfer.errors import RequestError

    llama = Llama3(TOOLS)
    two = history(llama, [("get_weather", PARIS), ("add", {"a": 1, "b": 2})])
    with pytest.raises(RequestError, match="single tool-calls"):  # why the grammar asks Llama for one call
        ChatTemplate(LLAMA33).render(two, tools=openai_tools(TOOLS))
    plain = Mistral(TOOLS)
    raw = history(plain, [("add", {"a": 1, "b": 2})])
    raw[2]["tool_calls"][0]["id"] = "call_1abcdef"  # a client's id, not mapped
    with pytest.raises(RequestError, match="length 9"):  # why history_id exists
        ChatTemplate(NEMO).render(raw, tools=openai_tools(TOOLS))


# --- the grammars, on the default model's vocabulary ---------------------------------------------


@pytest.fixture(scope="module")
def grammars(model_path):
    model = Model(model_path)
    return Grammars(model.vocab), model.vocab


@pytest.mark.model
def test_llama3_grammars(grammars):
    fmt = Llama3(TOOLS)
    call = fmt.write_calls([("get_weather", NESTED)])
    for parallel in (False, True):
        forced = fmt.grammar(TOOLS, required=True, parallel=parallel, answer="")
        assert matches(grammars, forced, call)
        assert matches(grammars, forced, fmt.write_calls([("add", {"a": 1, "b": 2})]))
        bad = {
            "two calls (the template takes one)": fmt.write_calls([("add", {"a": 1, "b": 2})] * 2),
            "a required argument left out": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            "out of range": '{"name": "get_weather", "parameters": {"city": "Paris", "days": 15}}',
            "a tool not offered": '{"name": "other", "parameters": {}}',
            "text before": "Sure. " + call,
            "an argument the tool lacks": '{"name": "add", "parameters": {"a": 1, "b": 2, "c": 3}}',
        }
        assert [why for why, text in bad.items() if matches(grammars, forced, text)] == []
    auto = fmt.grammar(TOOLS, required=False, parallel=True, answer=fmt.answer_rule(None))
    assert matches(grammars, auto, "It is sunny in Paris.")
    assert matches(grammars, auto, call)
    assert matches(grammars, auto, 'Text with {"name": "x"} inside is text.')
    assert not matches(grammars, auto, '{"name": "other", "parameters": {}}')  # begins like a call: held to one
    assert not matches(grammars, auto, '{"name": "get_weather", "parameters": {"city": "Paris"}}')
    json_answer = fmt.answer_rule({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    auto_json = fmt.grammar(TOOLS, required=False, parallel=False, answer=json_answer)
    assert matches(grammars, auto_json, '{"a": 1}')
    assert matches(grammars, auto_json, call)
    assert not matches(grammars, auto_json, "Text.")


@pytest.mark.model
def test_mistral_grammars(grammars):
    fmt = Mistral(TOOLS)
    calls = [("get_weather", NESTED), ("add", {"a": 1, "b": 2})]
    forced = fmt.grammar(TOOLS, required=True, parallel=True, answer="")
    assert matches(grammars, forced, fmt.write_calls(calls))
    assert matches(grammars, forced, fmt.write_calls(calls[:1]))
    one = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "%s"}]'
    bad = {
        "no id": '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',
        "a short id": one % "abc",
        "an id with a dash": one % "abcd-fghi",
        "no call": "[TOOL_CALLS][]",
        "a required argument left out": '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}, "id": "abcdefghi"}]',
        "a tool not offered": '[TOOL_CALLS][{"name": "x", "arguments": {}, "id": "abcdefghi"}]',
        "text before": "Sure. " + one % "abcdefghi",
    }
    assert [why for why, text in bad.items() if matches(grammars, forced, text)] == []
    single = fmt.grammar(TOOLS, required=True, parallel=False, answer="")
    assert matches(grammars, single, fmt.write_calls(calls[:1]))
    assert not matches(grammars, single, fmt.write_calls(calls))
    auto = fmt.grammar(TOOLS, required=False, parallel=True, answer=fmt.answer_rule(None))
    assert matches(grammars, auto, "It is sunny in Paris.")
    assert matches(grammars, auto, fmt.write_calls(calls))
    assert matches(grammars, auto, "I will look it up. " + fmt.write_calls(calls))
    assert not matches(grammars, auto, "I will look it up. [TOOL_CALLS][{}]")
    json_answer = fmt.answer_rule({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    auto_json = fmt.grammar(TOOLS, required=False, parallel=False, answer=json_answer)
    assert matches(grammars, auto_json, '{"a": 1}')
    assert matches(grammars, auto_json, fmt.write_calls(calls[:1]))
    assert not matches(grammars, auto_json, "Text. " + fmt.write_calls(calls[:1]))


# --- on the default model's weights, with each family's real template ------------------------------


def with_template(model: Path, template: str, out: Path) -> Path:
    """A copy of the model whose GGUF carries this chat template (gguf's own tool rewrites the metadata)."""
    source = out.with_suffix(".jinja")
    source.write_text(template)
    tool = Path(sys.executable).parent / "gguf-new-metadata"
    subprocess.run(
        [str(tool), str(model), str(out), "--chat-template-file", str(source), "--force"],
        check=True,
        capture_output=True,
    )
    return out


TEMPLATE_OF = {"llama3": LLAMA33, "mistral": NEMO}


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda f: f.name)
def family_engine(request, model_path, tmp_path_factory):
    family = request.param
    path = with_template(model_path, TEMPLATE_OF[family.name], tmp_path_factory.mktemp(family.name) / "model.gguf")
    engine = make_engine(EngineConfig(model=path, parallel=8, ctx_size=16384))
    yield family, engine
    engine.close()


@pytest.mark.model
def test_the_prompt_is_the_one_transformers_renders(family_engine):
    from transformers.utils.chat_template_utils import render_jinja_template

    family, engine = family_engine
    fmt = family(TOOLS)
    assert format_class(engine.template.source, engine.template.renders_tools) is family
    messages = history(fmt, [("get_weather", NESTED)])
    messages.append({"role": "assistant", "content": "It is 21 degrees."})
    messages.append({"role": "user", "content": "And in Rome?"})
    ours = engine.chat_text(messages, openai_tools(TOOLS))
    (theirs,), _ = render_jinja_template(
        conversations=[messages],
        tools=openai_tools(TOOLS),
        chat_template=TEMPLATE_OF[family.name],
        add_generation_prompt=True,
        bos_token=engine.template.bos,
        eos_token=engine.template.eos,
    )
    assert ours == theirs
    assert "get_weather" in ours and "21 degrees" in ours  # the tools and the whole history are in it


@pytest.mark.model
@pytest.mark.parametrize("parallel", [False, True], ids=["one", "parallel"])
def test_forced_calls_at_temperature_0_8_all_validate(family_engine, parallel: bool):
    family, engine = family_engine
    fmt = family(TOOLS)
    messages = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]
    prompt = engine.chat_prompt(messages, openai_tools(TOOLS))
    source = fmt.grammar(TOOLS, required=True, parallel=parallel, answer="")
    params = SamplingParams(
        temperature=0.8,
        seed=7,
        max_tokens=600,  # room for MAX_CALLS calls: a small model left free repeats one call
        grammar=Grammar.model_construct(kind="lark", source=source, origin="tools"),
    )
    # 14 answers here, each also parsed as it streams and fed back; test_tool_families validates 36 more per family
    # through the server, on the same templates.
    handles = [h for _ in range(2) for h in engine.submit(prompt, params, n=7)]
    schemas = {t.name: t.parameters for t in TOOLS}
    for h in handles:
        events = h.collect()
        finish = events[-1]
        assert finish.finish_reason == "stop", (finish.finish_reason, finish.text)
        before, calls = fmt.parse(finish.text, final=True)
        assert before is None and calls, finish.text
        assert len(calls) == 1 or (parallel and family is Mistral)  # Llama's grammar: one call (its template's)
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        if family is Mistral:
            ids = [c.id for c in calls]  # the model's, or None where it repeated one (the server makes a new one)
            assert ids[0] and all(i is None or re.fullmatch("[A-Za-z0-9]{9}", i) for i in ids), ids
        # Streamed, the same calls come out of the chunks as they arrive, and no content.
        content, streamed_calls = streamed(fmt, [e.text for e in events if isinstance(e, Chunk)])
        assert (content.strip(), streamed_calls) == ("", calls)
    # The last answer's calls, fed back as history, render in the family's syntax and read back the same.
    ids = [c.id or fmt.new_id() for c in calls]
    back = [
        *messages,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [fmt.history_call(i, c.name, args(c)) for i, c in zip(ids, calls, strict=True)],
        },
        *[{"role": "tool", "content": "ok", "tool_call_id": fmt.history_id(i)} for i in ids],
    ]
    again = fmt.parse(written_back(fmt, engine.chat_text(back, openai_tools(TOOLS)), engine.template.eos), True)[1]
    assert [(c.name, args(c)) for c in again] == [(c.name, args(c)) for c in calls]
