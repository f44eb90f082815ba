"""Anthropic's Messages API: the translation and rendering without a model, then the official
`anthropic` SDK, unmodified, over the Unix socket against a served model."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from edgeinfer.client import anthropic_client, async_anthropic_client
from edgeinfer.errors import RequestError
from edgeinfer.events import Finish, StreamStats
from edgeinfer.server.messages import MessagesDialect, to_input
from edgeinfer.server.messages_schema import CountTokensRequest, MessagesRequest, ToolResultBlock
from edgeinfer.server.output import Done, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta

from . import gate
from .conftest import raw, start_server, stop_process

pytestmark = pytest.mark.model

KEY = "k-messages"
MODEL = "default"
GREEDY = {"temperature": 0}  # this SDK release sends no sampling fields of its own: the body takes them

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city now.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# --- without a model: translation and rendering ----------------------------------


def body(**kw):
    return MessagesRequest.model_validate({"model": MODEL, "max_tokens": 16, **kw})


@pytest.mark.pure
def test_a_conversation_with_tools_becomes_the_internal_chat_request():
    req = to_input(
        body(
            system=[
                {"type": "text", "text": "Be brief."},
                {"type": "text", "text": "Use tools.", "cache_control": {"type": "ephemeral"}},
            ],
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "call it", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                        {"type": "text", "text": "And so?"},
                    ],
                },
            ],
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            stop_sequences=["END"],
            temperature=0.5,
            top_k=5,
        )
    )
    roles = [t.role for t in req.turns]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert req.turns[0].text == "Be brief.\n\nUse tools."
    assistant = req.turns[2]
    assert assistant.text == "Checking."  # the thinking is not replayed
    assert assistant.calls[0].id == "toolu_1" and assistant.calls[0].arguments == {"city": "Paris"}
    assert (req.turns[3].call_id, req.turns[3].name, req.turns[3].text) == ("toolu_1", "get_weather", "sunny")
    assert req.tools[0].parameters == WEATHER["input_schema"] and req.tools[0].origin == "tools.0.input_schema"
    assert (req.tool_choice, req.forced, req.parallel_calls) == ("required", "get_weather", False)
    s = req.sampling
    assert (s.stop, s.temperature, s.top_k, s.max_tokens) == (["END"], 0.5, 5, 16)
    assert req.named == {"temperature", "top_k"}  # the model's recommended top_p may fill the rest


@pytest.mark.pure
@pytest.mark.parametrize(
    ("choice", "want"), [({"type": "any"}, "required"), ({"type": "auto"}, "auto"), ({"type": "none"}, "none")]
)
def test_tool_choice_maps_onto_chat(choice, want):
    req = to_input(body(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice=choice))
    assert req.tool_choice == want and req.parallel_calls is True  # Anthropic's default


@pytest.mark.pure
def test_output_config_format_is_the_answers_format_and_its_errors_name_it():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    req = to_input(
        body(
            messages=[{"role": "user", "content": "hi"}],
            output_config={"format": {"type": "json_schema", "schema": schema}},
        )
    )
    assert json.loads(req.answer_format.source) == schema and req.answer_format.origin == "output_config.format.schema"


@pytest.mark.pure
def test_a_tool_result_without_its_tool_use_is_refused():
    result = {"type": "tool_result", "tool_use_id": "toolu_x", "content": "42", "is_error": True}
    with pytest.raises(RequestError, match="toolu_x"):
        to_input(
            CountTokensRequest.model_validate({"model": MODEL, "messages": [{"role": "user", "content": [result]}]})
        )


def finish(reason="stop", prompt=10, cached=4, completion=3, stop_sequence=None):
    stats = StreamStats(prompt, cached, completion, 0.01, 100.0, 0.1)
    return Finish(0, reason, "", [], stats, stop_sequence=stop_sequence)


def events_of(items):
    """SSE items as (name, data), each checked against the SDK's own event types."""
    out = []
    for item in items:
        data = json.loads(item["data"])
        assert item["event"] == data["type"]
        if data["type"] not in ("ping", "error"):
            TypeAdapter(RawMessageStreamEvent).validate_python(data)
        out.append((item["event"], data))
    return out


@pytest.mark.pure
def test_streamed_text_and_a_tool_call_render_anthropics_event_sequence():
    d = MessagesDialect("m", prompt_tokens=10)
    call = ToolCall(0, 0, "call_abc", "get_weather", '{"city": "Paris"}')
    done = Done(0, "tool_calls", finish("stop"))
    items = d.start(1)
    for ev in [TextDelta(0, "Let me "), TextDelta(0, ""), TextDelta(0, "look."), call, done]:
        items += d.on(ev)
    items += d.end([done])
    evs = events_of(items)
    assert [n for n, _ in evs] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert evs[6][1]["content_block"] == {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}
    assert evs[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'}
    assert evs[9][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    usage = evs[9][1]["usage"]
    assert usage == {
        "input_tokens": 6,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 4,
        "output_tokens": 3,
    }
    whole = d.response([done], [TextDelta(0, "Let me look."), call, done])
    msg = Message.model_validate(whole)
    assert msg.content[0].text == "Let me look." and msg.content[1].input == {"city": "Paris"}
    assert msg.id.startswith("msg_") and msg.stop_reason == "tool_use"


@pytest.mark.pure
def test_a_streamed_call_sends_its_input_as_the_model_writes_it():
    d = MessagesDialect("m", prompt_tokens=10)
    pieces = [
        ToolCallDelta(0, 0, "call_abc", "get_weather", ""),
        ToolCallDelta(0, 0, "call_abc", None, '{"city": "Pa'),
        ToolCallDelta(0, 0, "call_abc", None, 'ris"'),
    ]
    call = ToolCall(0, 0, "call_abc", "get_weather", '{"city": "Paris"}')
    done = Done(0, "tool_calls", finish("stop"))
    items = d.start(1)
    for ev in [TextDelta(0, "Let me look."), *pieces, call, done]:
        items += d.on(ev)
    items += d.end([done])
    evs = events_of(items)
    blocks = [(n, data.get("index")) for n, data in evs if n.startswith("content_block")]
    assert blocks == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),  # the rest, sent with the whole call
        ("content_block_stop", 1),
    ]
    start = next(data for n, data in evs if n == "content_block_start" and data["index"] == 1)
    assert start["content_block"] == {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}
    parts = [data["delta"]["partial_json"] for n, data in evs if n == "content_block_delta" and data["index"] == 1]
    assert parts == ['{"city": "Pa', 'ris"', "}"] and json.loads("".join(parts)) == {"city": "Paris"}


@pytest.mark.pure
@pytest.mark.parametrize(
    ("reason", "seq", "want"),
    [("stop", None, "end_turn"), ("length", None, "max_tokens"), ("stop_sequence", "END", "stop_sequence")],
)
def test_stop_reasons(reason, seq, want):
    done = Done(0, reason, finish(reason if reason != "stop_sequence" else "stop", stop_sequence=seq), seq)
    msg = Message.model_validate(MessagesDialect("m").response([done], [TextDelta(0, "hi"), done]))
    assert (msg.stop_reason, msg.stop_sequence) == (want, seq)


@pytest.mark.pure
def test_reasoning_is_a_thinking_block_before_the_text():
    """Nothing emits ReasoningDelta yet (issue 28); its rendering is ready and parses in the SDK."""
    d = MessagesDialect("m")
    done = Done(0, "stop", finish())
    evs = [ReasoningDelta(0, "Paris is "), ReasoningDelta(0, "the capital."), TextDelta(0, "Paris."), done]
    items = d.start(1) + [item for ev in evs for item in d.on(ev)] + d.end([done])
    names = [n for n, _ in events_of(items)]
    assert names.count("content_block_start") == 2 and names.count("content_block_stop") == 2
    msg = Message.model_validate(MessagesDialect("m").response([done], evs))
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.content[0].thinking == "Paris is the capital."


@pytest.mark.pure
def test_nothing_follows_an_error_event():
    d = MessagesDialect("m")
    items = d.start(1) + d.on(TextDelta(0, "par"))
    items.append(d.error_event("the engine failed", "server_error"))
    done = Done(0, "error", finish("error"))
    items += d.on(done) + d.end([done])
    evs = events_of(items)
    assert evs[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "the engine failed"}})


# --- the official SDK against a served model ----------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sock = tmp_path_factory.mktemp("msg") / "edgeinfer.sock"
    proc = start_server(sock, "--parallel", "4", "--api-key", KEY, "--max-body-mb", "1")
    yield sock
    stop_process(proc)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic_client(server, api_key=KEY)


def user(text):
    return [{"role": "user", "content": text}]


def test_create_text_and_usage_against_count_tokens(claude):
    kw = {"model": MODEL, "messages": user("What is the capital of France?"), "system": "You are a helpful assistant."}
    r = claude.messages.create(**kw, max_tokens=24, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason in ("end_turn", "max_tokens") and 0 < r.usage.output_tokens <= 24
    counted = claude.messages.count_tokens(**kw).input_tokens
    # Anthropic counts the tokens read from the cache apart; together they are the whole prompt.
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == counted > 10
    again = claude.messages.create(**kw, max_tokens=4, extra_body=GREEDY)
    assert again.usage.cache_read_input_tokens > 0  # the prefix cache, reported as Anthropic reports it
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == counted


def test_max_tokens_and_stop_sequences(claude):
    kw = {"model": MODEL, "messages": user("Describe the sea in one sentence."), "extra_body": GREEDY}
    cut = claude.messages.create(**kw, max_tokens=3)
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 3)
    # "e" comes early in any English sentence; the answer says which of the stop strings matched.
    r = claude.messages.create(**kw, max_tokens=40, stop_sequences=["zebra crossing", "e"])
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", "e")
    gate.absent("e", "".join(b.text for b in r.content))  # the text stops before the stop string


def test_stream_deltas_equal_the_final_message(claude):
    kw = {"model": MODEL, "messages": user("Name three fruits."), "max_tokens": 24, "extra_body": GREEDY}
    whole = claude.messages.create(**kw)
    deltas, types = [], []
    with claude.messages.stream(**kw) as stream:
        for ev in stream:
            types.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                deltas.append(ev.delta.text)
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop" and "message_delta" in types
    gate.one_generation(final.content[0].text, "".join(deltas))
    # Two requests: the second is warm from the prefix cache and may part from the first at a near-tie.
    for message in (whole, final):
        assert message.stop_reason in ("end_turn", "max_tokens") and 0 < message.usage.output_tokens <= 24
        gate.follows_greedy(message.content[0].text, kw["messages"], 24)


def test_raw_stream_is_anthropics_event_sequence(server):
    http = raw(server, headers={"x-api-key": KEY})
    payload = {"model": MODEL, "messages": user("Hi"), "max_tokens": 5, "stream": True, **GREEDY}
    with http.stream("POST", "/v1/messages", json=payload) as r:
        lines = list(r.iter_lines())
    names = [ln[7:] for ln in lines if ln.startswith("event: ")]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert not any("[DONE]" in ln for ln in lines)


TOOL_TURN = {
    "model": MODEL,
    "messages": user("What is the weather in Paris?"),
    "max_tokens": 60,
    "tools": [WEATHER],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    "extra_body": GREEDY,
}


@pytest.fixture(scope="module")
def called(claude):
    """The model's answer when it must call get_weather (made once for the tests that follow it)."""
    return claude.messages.create(**TOOL_TURN)


def test_tool_use_then_tool_result_then_a_text_answer(claude, called):
    assert called.stop_reason == "tool_use"
    [use] = [b for b in called.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])
    # count_tokens counts the tools' description too, as /v1/messages renders it.
    bare = claude.messages.count_tokens(model=MODEL, messages=TOOL_TURN["messages"]).input_tokens
    assert (
        claude.messages.count_tokens(model=MODEL, messages=TOOL_TURN["messages"], tools=[WEATHER]).input_tokens
        > bare + 20
    )
    answer = claude.messages.create(
        model=MODEL,
        max_tokens=30,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            *TOOL_TURN["messages"],
            {"role": "assistant", "content": called.content},  # the SDK's own blocks, sent back
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 24 C"}]},
        ],
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text.strip()


def test_streamed_input_json_delta_reassembles_the_input(claude, called):
    partial = []
    with claude.messages.stream(**TOOL_TURN) as s:
        for ev in s:
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                partial.append(ev.delta.partial_json)
        final = s.get_final_message()
    [use] = [b for b in final.content if b.type == "tool_use"]
    gate.one_generation(use.input, json.loads("".join(partial)))
    jsonschema.validate(use.input, WEATHER["input_schema"])  # as the whole answer's (called) is
    assert final.stop_reason == "tool_use" and use.id.startswith("toolu_")


async def test_async_client_and_x_api_key(server):
    good = async_anthropic_client(server, api_key=KEY)
    r = await good.messages.create(model=MODEL, messages=user("Hi"), max_tokens=4, extra_body=GREEDY)
    assert r.usage.output_tokens > 0
    bad = anthropic_client(server, api_key="wrong").with_options(max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad.messages.create(model=MODEL, messages=user("Hi"), max_tokens=4)
    assert e.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": e.value.body["error"]["message"]},
    }
    assert "x-api-key" in e.value.body["error"]["message"]


HI = user("hi")
RESULT = {"type": "tool_result", "tool_use_id": "toolu_nope", "content": "42"}
BAD = [
    ("no max_tokens", {"model": MODEL, "messages": HI}, "max_tokens"),
    ("max_tokens 0", {"model": MODEL, "messages": HI, "max_tokens": 0}, "max_tokens"),
    ("max_tokens a string", {"model": MODEL, "messages": HI, "max_tokens": "ten"}, "max_tokens"),
    ("no messages", {"model": MODEL, "max_tokens": 8}, "messages"),
    ("empty messages", {"model": MODEL, "messages": [], "max_tokens": 8}, "messages"),
    ("messages a string", {"model": MODEL, "messages": "hi", "max_tokens": 8}, "messages"),
    (
        "unknown block",
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "video"}]}], "max_tokens": 8},
        "'video'",
    ),
    (
        "image block",
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        "text only",
    ),
    (
        "document in a tool result",
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{**RESULT, "content": [{"type": "document"}]}]}],
        },
        "text only",
    ),
    (
        "tool_result without tool_use",
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [RESULT]}]},
        "toolu_nope",
    ),
    (
        "tool_use from the user",
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}],
        },
        "assistant",
    ),
    (
        "text block without text",
        {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "text",
    ),
    (
        "server tool",
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": HI,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
        },
        "server tool",
    ),
    (
        "tool without schema",
        {"model": MODEL, "max_tokens": 8, "messages": HI, "tools": [{"name": "f"}]},
        "input_schema",
    ),
    (
        "unknown named tool",
        {
            "model": MODEL,
            "max_tokens": 8,
            "messages": HI,
            "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": "nope"},
        },
        "nope",
    ),
    (
        "any without tools",
        {"model": MODEL, "max_tokens": 8, "messages": HI, "tool_choice": {"type": "any"}},
        "at least one tool",
    ),
    ("temperature over 1", {"model": MODEL, "max_tokens": 8, "messages": HI, "temperature": 1.5}, "temperature"),
    (
        "stop_sequences a string",
        {"model": MODEL, "max_tokens": 8, "messages": HI, "stop_sequences": "x"},
        "stop_sequences",
    ),
    ("unknown field", {"model": MODEL, "max_tokens": 8, "messages": HI, "frequency_penalty": 1}, "frequency_penalty"),
    (
        "thinking of an unknown type",
        {"model": MODEL, "max_tokens": 8, "messages": HI, "thinking": {"type": "deep"}},
        "thinking",
    ),
    (
        "lone surrogate",
        '{"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "\\ud800"}]}',
        "surrogate",
    ),
    ("not JSON", '{"model": "default", "max_tokens": 8,', "JSON"),
    ("too many messages", {"model": MODEL, "max_tokens": 8, "messages": HI * 4097}, "messages"),
    ("prompt over the context", {"model": MODEL, "max_tokens": 8, "messages": user("hello " * 12000)}, "context"),
]


@pytest.mark.parametrize(("name", "payload", "needle"), BAD, ids=[b[0] for b in BAD])
def test_malformed_bodies_are_400_in_anthropics_envelope(server, name, payload, needle):
    http = raw(server, headers={"x-api-key": KEY, "content-type": "application/json"})
    content = payload if isinstance(payload, str) else json.dumps(payload)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        if path.endswith("count_tokens") and isinstance(payload, dict):
            payload = {k: v for k, v in payload.items() if k not in ("max_tokens", "temperature", "stop_sequences")}
            if name in (
                "no max_tokens",
                "max_tokens 0",
                "max_tokens a string",
                "temperature over 1",
                "stop_sequences a string",
                "prompt over the context",
            ):
                continue  # fields count_tokens does not take, or a prompt it only counts
            content = json.dumps(payload)
        r = http.post(path, content=content)
        assert r.status_code == 400, (path, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert needle in err["error"]["message"], err


def test_other_errors_and_the_server_still_serves(server, claude):
    http = raw(server, headers={"x-api-key": KEY})
    for method, path, status, kind in [
        ("POST", "/v1/messages/nope", 404, "not_found_error"),
        ("GET", "/v1/messages", 405, "invalid_request_error"),
    ]:
        r = http.request(method, path)
        assert r.status_code == status and r.json()["error"]["type"] == kind, r.text
    big = json.dumps({"model": MODEL, "max_tokens": 4, "messages": user("x" * 2**20)}).encode()
    r = http.post("/v1/messages", content=(big[i : i + 65536] for i in range(0, len(big), 65536)))  # chunked
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text
    r = http.post("/v1/messages", content=big)  # its Content-Length says it is too large: refused unread
    assert r.status_code == 413 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "request_too_large", r.text
    # A server of one model answers to the names Claude Code sends, and says which model answered.
    other = claude.messages.create(model="claude-opus-4", messages=HI, max_tokens=4, extra_body=GREEDY)
    assert other.model == "SmolLM2-135M-Instruct.Q4_1"
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        claude.messages.create(model=MODEL, messages=HI, max_tokens=0)
    assert raw(server).get("/health").json() == {"status": "ok"}
    assert claude.messages.create(model=MODEL, messages=HI, max_tokens=4, extra_body=GREEDY).content


@pytest.mark.pure
def test_a_failed_tool_result_tells_the_model_so():
    block = {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "no such city"}]}
    assert ToolResultBlock.model_validate({**block, "is_error": True}).text() == "Error: no such city"
    assert ToolResultBlock.model_validate(block).text() == "no such city"
