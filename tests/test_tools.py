"""Agents over the socket: response_format, tools and tool_choice, through the official openai client."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from edgeinfer import prepare as T
from edgeinfer.bench.battery import CASES, WEATHER, check
from edgeinfer.client import async_client, client
from edgeinfer.formats.base import MAX_CALLS, Call, CallStream, call_schema
from edgeinfer.formats.hermes import Hermes
from edgeinfer.server.schema import ChatRequest

from . import gate
from .conftest import raw
from .fakes import fake_facts

pytestmark = pytest.mark.model

MODEL = "default"
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "$defs": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "properties": {"zone": {"$ref": "#/$defs/zone"}},
            "required": ["zone"],
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}


@pytest.fixture(params=["auto", "off"])
def any_server(request):
    """Each speculation mode in turn, for the validity checks."""
    return request.getfixturevalue("server" if request.param == "auto" else "server_spec_off")


@pytest.fixture
def oai(server):
    return client(server)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def valid_calls(calls) -> list[str]:
    """The names of the calls, each checked against its tool's parameters."""
    for c in calls:
        assert c.id.startswith("call_") and c.type == "function"
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return [c.function.name for c in calls]


def test_json_schema_answers_validate_streaming_and_not(any_server):
    """A third of the battery per speculation mode, at temperature 0.8, n up to 4, streamed and whole."""
    cases = CASES[::3]

    async def one(aoai, i, case):
        fmt = {"type": "json_schema", "json_schema": {"name": case.name, "schema": case.schema, "strict": True}}
        kw = dict(model=MODEL, messages=ask(case.prompt), response_format=fmt, temperature=0.8, max_tokens=300)
        n = 1 + i % 4
        if i % 2:
            r = await aoai.chat.completions.create(**kw, n=n)
            return [(case, c.message.content, c.finish_reason) for c in r.choices]
        texts, reasons = [""] * n, [None] * n
        async for chunk in await aoai.chat.completions.create(**kw, n=n, stream=True):
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
                reasons[c.index] = c.finish_reason or reasons[c.index]
        return [(case, t, r) for t, r in zip(texts, reasons, strict=True)]

    async def run():
        aoai = async_client(any_server)
        return await asyncio.gather(*(one(aoai, i, c) for i, c in enumerate(cases)))

    answers = [a for group in asyncio.run(run()) for a in group]
    assert len(answers) == sum(1 + i % 4 for i in range(len(cases)))
    bad = [(case.name, reason, check(case, text), text[:100]) for case, text, reason in answers]
    assert [b for b in bad if b[1] != "stop" or b[2]] == []


def test_json_object_is_an_object(oai):
    """Any object: nothing bounds its size, so an answer cut by max_tokens is cut JSON; the others parse."""
    r = oai.chat.completions.create(
        model=MODEL,
        messages=ask("Describe a cat as JSON with a name and an age."),
        response_format={"type": "json_object"},
        temperature=0.8,
        n=4,
        max_tokens=300,
    )
    done = [c.message.content for c in r.choices if c.finish_reason == "stop"]
    assert done and all(isinstance(json.loads(text), dict) for text in done)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_calls_validate(any_server, choice):
    oai = client(any_server)
    kw = dict(model=MODEL, messages=ask("What time is it in Tokyo?"), tools=[WEATHER, CLOCK], tool_choice=choice)
    r = oai.chat.completions.create(**kw, temperature=0.8, n=4, max_tokens=120)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and c.message.content is None
        names = valid_calls(c.message.tool_calls)
        assert len(names) == 1  # parallel_tool_calls defaults to false
        if isinstance(choice, dict):
            assert names == ["get_time"]


def test_streamed_tool_calls_reassemble_in_the_sdk(oai):
    kw = dict(model=MODEL, messages=ask("Weather in Oslo?"), tools=[WEATHER, CLOCK], tool_choice="required")
    with oai.chat.completions.stream(**kw, temperature=0, max_tokens=300, parallel_tool_calls=True) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert 1 <= len(valid_calls(choice.message.tool_calls)) <= MAX_CALLS


def test_auto_answers_in_text_or_in_a_valid_call(oai):
    history = [
        *ask("What's the weather in Rome?"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 24, "sky": "clear"}'},
    ]
    r = oai.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0.8, n=4, max_tokens=60)
    for c in r.choices:
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            valid_calls(c.message.tool_calls)
        else:
            assert c.message.content
            gate.absent("<tool_call>", c.message.content)  # an opened call is parsed out, never shown


def test_tool_choice_none_is_plain_text(oai):
    r = oai.chat.completions.create(
        model=MODEL, messages=ask("Hi!"), tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=16
    )
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


def test_constrained_and_forced_tokens_are_counted(server, oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "keys", "schema": CASES[-1].schema}}
    oai.chat.completions.create(model=MODEL, messages=ask(CASES[-1].prompt), response_format=fmt, temperature=0)
    tokens = raw(server).get("/v1/edgeinfer/stats").json()["tokens"]
    assert tokens["generated"] >= tokens["constrained"] > tokens["forced"] > 0
    text = raw(server).get("/metrics").text
    gate.contains(text, "edgeinfer_forced_tokens_total")
    gate.contains(text, "edgeinfer_constrained_tokens_total")


def test_completions_take_a_grammar(server):
    body = {"model": MODEL, "prompt": "Is the sky green? Answer:", "grammar": 'start: " yes" | " no"', "max_tokens": 8}
    r = raw(server).post("/v1/completions", json=body)
    assert r.status_code == 200
    gate.allowed(r.json()["choices"][0]["text"], (" yes", " no"))


BAD = [
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools.0.function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among tools"),
    ({"tool_choice": "required"}, "at least one tool"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "tool_call_id"),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{"}}]}]},
        "not JSON text",
    ),
    ({"tools": [WEATHER, WEATHER]}, "share a name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"not": {}}}}}}]},
        "'not' at /properties/a",
    ),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}}, "/type"),
    ({"response_format": {"type": "json_schema"}}, "needs a json_schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"uniqueItems": True}}}},
        "'uniqueItems'",
    ),
    ({"grammar": "start: undefined_rule"}, "lark grammar is not valid"),
    ({"grammar": 'start: "a"', "tools": [WEATHER]}, "cannot be combined"),
    ({"logit_bias": {"x": 1}}, "token ids"),
    ({"logit_bias": {"5": 500}}, "-100 to 100"),
]


@pytest.mark.parametrize(("extra", "words"), BAD)
def test_bad_agent_input_is_a_400_naming_the_problem(server, extra, words):
    body = {"model": MODEL, "messages": ask("hi"), "max_tokens": 4, **extra}
    http = raw(server)
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"], r.json()
    assert http.get("/health").status_code == 200


def test_fields_real_clients_send_are_accepted(oai):
    r = oai.chat.completions.create(
        model=MODEL,
        messages=ask("Count to ten."),
        max_completion_tokens=3,
        store=False,
        metadata={"run": "test"},
        service_tier="auto",
        reasoning_effort="low",
        user="me",
        prompt_cache_key="agent-1",
        safety_identifier="someone",
        temperature=0,
    )
    assert r.usage.completion_tokens == 3


def test_two_tool_agent_loop_with_the_openai_agents_sdk(server):
    """A real agent framework drives the socket: two tools called in turn with valid arguments, then the answer."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        StopAtTools,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    calls: list[tuple[str, object]] = []

    # Each tool is offered in turn, and tool_choice "required" makes the model call it.
    @function_tool(is_enabled=lambda ctx, agent: not calls)
    def get_temperature(city: str) -> float:
        """The temperature in a city, in degrees Celsius."""
        calls.append(("get_temperature", city))
        return 21.5

    @function_tool(is_enabled=lambda ctx, agent: len(calls) == 1)
    def to_fahrenheit(celsius: float) -> str:
        """Convert degrees Celsius to Fahrenheit."""
        calls.append(("to_fahrenheit", celsius))
        return f"{celsius * 9 / 5 + 32:.1f} F"

    agent = Agent(
        name="weather",
        instructions="Find the temperature, then convert it to Fahrenheit.",
        tools=[get_temperature, to_fahrenheit],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=async_client(server)),
        model_settings=ModelSettings(tool_choice="required", temperature=0.8, max_tokens=120),
        reset_tool_choice=False,
        tool_use_behavior=StopAtTools(stop_at_tool_names=["to_fahrenheit"]),
    )
    result = asyncio.run(Runner.run(agent, "How warm is it in Lisbon, in Fahrenheit?", max_turns=4))
    assert [name for name, _ in calls] == ["get_temperature", "to_fahrenheit"]
    assert isinstance(calls[0][1], str) and calls[0][1]
    assert isinstance(calls[1][1], float)
    assert result.final_output == f"{calls[1][1] * 9 / 5 + 32:.1f} F"


# --- the pieces, without a model ------------------------------------------------------


@pytest.mark.pure
def test_parse_calls_and_the_text_before():
    text = (
        'Let me check. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    before, calls = Hermes().parse(text, final=True)
    assert before == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", {"a": 1}), ("g", {})]
    assert Hermes().parse("plain text", final=True) == ("plain text", [])
    cut = '<tool_call>\n{"name": "f", "argu'
    assert Hermes().parse(cut, final=True) == (cut, [])


@pytest.mark.pure
def test_streamed_text_holds_back_what_may_open_a_call():
    w = CallStream(Hermes())
    assert [w.feed(x)[0] for x in ["Sure", " <", "tool", "_call>", '{"name"']] == ["Sure", " ", "", "", ""]
    assert w.end() == ('<tool_call>{"name"', [])  # no call came of it: the text is the answer
    w = CallStream(Hermes())
    assert [w.feed(x)[0] for x in ["a <t", "able> b"]] == ["a ", "<table> b"]
    w = CallStream(Hermes())
    assert w.feed("x <tool")[0] == "x " and w.end() == ("<tool", [])


@pytest.mark.pure
def test_a_streamed_call_is_given_out_once_complete():
    w = CallStream(Hermes())
    parts = [
        "Ok <tool_call>\n",
        '{"name": "f", "argu',
        'ments": {"a": 1}}',
        "\n</tool_call>\n<tool_call>",
        '{"name": "g"',
    ]
    got = [w.feed(x) for x in parts]
    assert [text for text, _ in got] == ["Ok ", "", "", "", ""]
    assert [[c.name for c in calls] for _, calls in got] == [[], [], ["f"], [], []]
    assert w.end() == ("", [])  # the second call was cut: left out


@pytest.mark.pure
def test_tool_schemas_keep_their_references_under_defs():
    req = ChatRequest(model="m", messages=ask("hi"), tools=[WEATHER, CLOCK], tool_choice="required")
    schema = call_schema(T.specs(req.to_input()))
    zone = schema["$defs"]["tool1"]["properties"]["zone"]
    assert zone == {"$ref": "#/$defs/tool1/$defs/zone"}
    call = {"name": "get_time", "arguments": {"zone": "UTC"}}
    jsonschema.validate(call, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_time", "arguments": {"zone": "utc"}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"zone": "UTC"}}, schema)


# A template that renders tools, and the history as such templates read it: call ids, arguments
# as a mapping, and results by tool_call_id.
TOOL_TEMPLATE = (
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call {{ c.id }} {{ c.type }} {{ c.function.name }}"
    " city={{ c.function.arguments.city }}>{% endfor %}"
    "{% if m.tool_call_id %}<result {{ m.tool_call_id }} {{ m.name }}>{% endif %}\n{% endfor %}"
    "{% for t in tools or [] %}<tool {{ t.function.name }}>{% endfor %}"
)
HISTORY = [
    *ask("What's the weather in Rome?"),
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_7", "content": '{"celsius": 24}'},
]


class TemplateEngine:
    """Just what run.prepare uses of an engine: a template, the prompt render, the grammar check."""

    def __init__(self, source):
        from edgeinfer.engine.template import ChatTemplate

        self.template = ChatTemplate(source)
        self.rendered = ""
        self.grammars = self
        self.facts = fake_facts(self.template, self.special_token)  # what the server reads of the model

    def chat_text(self, messages, tools=None):
        self.rendered = self.template.render(messages, tools=tools)
        return self.rendered

    def chat_tokens(self, text):
        return [1, 2, 3]

    def compile(self, grammar):
        pass

    def special_token(self, text):
        return None  # the tags are text here


@pytest.mark.pure
@pytest.mark.parametrize("choice", ["auto", "none"])
def test_tool_history_reaches_a_tool_template_whole(choice):
    from edgeinfer.prepare import prepare

    engine = TemplateEngine(TOOL_TEMPLATE)
    assert engine.template.renders_tools
    prepare(engine, ChatRequest(model="m", messages=HISTORY, tools=[WEATHER], tool_choice=choice).to_input())
    assert "<call call_7 function get_weather city=Rome>" in engine.rendered
    assert '[tool]{"celsius": 24}<result call_7 get_weather>' in engine.rendered
    assert ("<tool get_weather>" in engine.rendered) == (choice == "auto")  # tools offered unless "none"
    assert "<tool_call>" not in engine.rendered and "You can call functions" not in engine.rendered


@pytest.mark.pure
def test_a_template_without_tools_gets_the_history_in_the_wire_format():
    from edgeinfer.prepare import prepare

    engine = TemplateEngine("{% for m in messages %}[{{ m.role }}]{{ m.content }}\n{% endfor %}")
    assert not engine.template.renders_tools
    prepare(engine, ChatRequest(model="m", messages=HISTORY, tools=[WEATHER]).to_input())
    assert '[assistant]<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>' in (
        engine.rendered
    )
    assert '[user]<tool_response>\n{"celsius": 24}\n</tool_response>' in engine.rendered
    assert engine.rendered.startswith("[system]You can call functions")


@pytest.mark.pure
def test_a_call_id_copied_from_the_history_is_replaced():
    from edgeinfer.formats.mistral import Mistral

    fmt = Mistral()
    req = ChatRequest(model="m", messages=HISTORY, tools=[WEATHER])
    T.chat_messages(req.to_input(), fmt, native=True)
    copied = fmt.history_id("call_7")  # the id the template showed the model for the call in the history
    assert fmt.call_id(Call("get_weather", "{}", copied)) != copied
    assert fmt.call_id(Call("get_weather", "{}", "a1B2c3D4e")) == "a1B2c3D4e"


@pytest.mark.pure
def test_the_template_gets_each_tool_as_the_client_sent_it():
    """Templates that print a tool whole (`tool | tojson`) print what the client sent, strict included."""
    sent = {
        "type": "function",
        "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True},
    }
    bare = {"type": "function", "function": {"name": "g"}}
    req = ChatRequest(model="m", messages=ask("hi"), tools=[sent, bare]).to_input()
    assert [t.as_template_takes_it() for t in req.tools] == [sent, bare]
