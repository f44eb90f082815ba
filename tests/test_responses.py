"""OpenAI's Responses API: the rendering and the store on hand-made events, then the official `openai`
SDK and the OpenAI Agents SDK (its default Responses model) over the Unix socket."""

from __future__ import annotations

import json
from typing import get_args

import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from edgeinfer.client import async_client, client
from edgeinfer.errors import RequestError
from edgeinfer.events import Finish, StreamStats
from edgeinfer.server.output import Done, TextDelta, ToolCall, ToolCallDelta
from edgeinfer.server.responses import to_input, turns_of
from edgeinfer.server.responses_render import ResponsesDialect
from edgeinfer.server.responses_schema import ResponsesRequest, parse_items, parse_tools
from edgeinfer.server.responses_store import ResponseStore

from . import gate
from .conftest import raw

pytestmark = pytest.mark.model

MODEL = "default"
# The SDK's event classes by their `type`, to validate each event we send against its own class.
EVENTS = {cls.model_fields["type"].annotation.__args__[0]: cls for cls in get_args(get_args(ResponseStreamEvent)[0])}


# --- pure: rendering, translation, store ---------------------------------------------


def _done(reason: str, text: str = "", completion: int = 3) -> Done:
    stats = StreamStats(
        prompt_tokens=10, cached_tokens=4, completion_tokens=completion, ttft_s=0.1, decode_tps=50.0, total_s=0.2
    )
    engine_reason = {"tool_calls": "stop"}.get(reason, reason)
    return Done(0, reason, Finish(0, engine_reason, text, [], stats))


def _stream(events) -> list[dict]:
    """Feed neutral events to a dialect as streaming does; the SSE items' JSON, each checked by the SDK's own types."""
    kept = []
    d = ResponsesDialect("m", {"tools": [], "tool_choice": "auto", "parallel_tool_calls": False}, kept.append)
    items = [*d.start(1)]
    for ev in events:
        items += d.on(ev)
    items += d.end([ev for ev in events if isinstance(ev, Done)])
    out = []
    for item in items:
        data = json.loads(item["data"])
        assert item["event"] == data["type"]
        EVENTS[data["type"]].model_validate(data)  # the SDK's own types, validated (not merely constructed)
        out.append(data)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    assert kept == [out[-1]["response"]]
    return out


@pytest.mark.pure
def test_streamed_text_is_the_typed_event_sequence():
    events = _stream([TextDelta(0, "Hel"), TextDelta(0, ""), TextDelta(0, "lo"), _done("stop", "Hello")])
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = Response.model_validate(events[-1]["response"])
    assert final.output_text == "Hello" == "".join(e["delta"] for e in events if "delta" in e)
    assert final.status == "completed"
    assert final.usage.input_tokens == 10 and final.usage.input_tokens_details.cached_tokens == 4
    assert final.usage.total_tokens == 13


@pytest.mark.pure
def test_streamed_call_follows_the_text_and_a_cut_answer_is_incomplete():
    call = ToolCall(0, 0, "call_1", "get_weather", '{"city": "Paris"}')
    events = _stream([TextDelta(0, "Let me see."), call, _done("tool_calls")])
    types = [e["type"] for e in events]
    assert types[-6:] == [
        "response.output_item.done",  # the message closes before the call opens
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = Response.model_validate(events[-1]["response"])
    assert [o.type for o in final.output] == ["message", "function_call"]
    assert final.output[1].call_id == "call_1" and json.loads(final.output[1].arguments) == {"city": "Paris"}

    cut = _stream([TextDelta(0, "a b c"), _done("length", "a b c")])
    final = Response.model_validate(cut[-1]["response"])
    assert cut[-1]["type"] == "response.incomplete"
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"


@pytest.mark.pure
def test_a_streamed_call_sends_its_arguments_as_the_model_writes_them():
    pieces = [
        ToolCallDelta(0, 0, "call_1", "get_weather", ""),
        ToolCallDelta(0, 0, "call_1", None, '{"city": "Pa'),
        ToolCallDelta(0, 0, "call_1", None, 'ris"'),
    ]
    call = ToolCall(0, 0, "call_1", "get_weather", '{"city": "Paris"}')
    events = _stream([TextDelta(0, "Let me see."), *pieces, call, _done("tool_calls")])
    types = [e["type"] for e in events]
    assert types[-8:] == [
        "response.output_item.done",  # the message closes before the call opens
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",  # the rest, sent with the whole call
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == ['{"city": "Pa', 'ris"', "}"]
    added = next(e for e in events if e["type"] == "response.output_item.added" and e["output_index"] == 1)
    assert added["item"]["call_id"] == "call_1" and added["item"]["arguments"] == ""
    assert len({e["item_id"] for e in events if "function_call_arguments" in e["type"]}) == 1
    final = Response.model_validate(events[-1]["response"])
    assert final.output[1].arguments == '{"city": "Paris"}' and final.output[1].id == added["item"]["id"]

    # Cut by max_output_tokens while its arguments streamed: the call ends incomplete, as far as it was written.
    cut = _stream([*pieces, _done("length")])
    final = Response.model_validate(cut[-1]["response"])
    assert [(o.type, o.status, o.arguments) for o in final.output] == [
        ("function_call", "incomplete", '{"city": "Paris"')
    ]


@pytest.mark.pure
def test_a_failed_stream_ends_in_response_failed():
    done = _done("error", "par")
    done.finish.error = "llama_decode failed"
    events = _stream([TextDelta(0, "par"), done])
    assert events[-1]["type"] == "response.failed" and events[-2]["item"]["status"] == "incomplete"
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "failed" and final.error.message == "llama_decode failed"
    d = ResponsesDialect("m", {})
    error = json.loads(d.error_event("the server is shutting down", "shutting_down")["data"])
    assert EVENTS["error"].model_validate(error).code == "shutting_down"


@pytest.mark.pure
def test_whole_response_and_an_empty_answer():
    d = ResponsesDialect("m", {"tools": [], "tool_choice": "auto", "parallel_tool_calls": False})
    call = ToolCall(0, 0, "call_9", "f", "{}")
    whole = Response.model_validate(d.response([_done("tool_calls")], [call, _done("tool_calls")]))
    assert [o.type for o in whole.output] == ["function_call"] and whole.output[0].call_id == "call_9"
    empty = _stream([_done("stop")])
    assert Response.model_validate(empty[-1]["response"]).output_text == ""


@pytest.mark.pure
def test_items_become_the_internal_chat_request():
    req = ResponsesRequest.model_validate(
        {
            "model": "m",
            "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "max_output_tokens": 9,
        }
    )
    items = parse_items(
        [
            {"role": "user", "content": "hi"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ]
    )
    chat = to_input(req, parse_tools(req.tools), items, 0)
    t = chat.turns
    assert [x.role for x in t] == ["system", "user", "assistant", "tool"]
    assert t[2].text == "ok" and t[2].calls[0].id == "c1" and t[2].calls[0].arguments == {}
    assert (t[3].call_id, t[3].text) == ("c1", "42")
    assert (chat.tool_choice, chat.forced, chat.sampling.max_tokens) == ("required", "f", 9)
    assert (
        json.loads(chat.answer_format.source) == {"type": "object"}
        and chat.answer_format.origin == "text.format.schema"
    )


@pytest.mark.pure
@pytest.mark.parametrize(
    "items, tools, says",
    [
        ([{"type": "function_call_output", "call_id": "nope", "output": "x"}], None, "matches no earlier"),
        ([{"type": "item_reference", "id": "x"}], None, "item_reference"),
        ([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}], None, "text only"),
        ([{"role": "user", "content": [{"type": "weird"}]}], None, "content part"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}], None, "not JSON"),
        ("hi", [{"type": "custom", "name": "apply_patch"}], "'custom', not served here"),
        ("hi", [{"type": "function", "name": "f"}, {"type": "function", "name": "f"}], "share a name"),
    ],
)
def test_bad_items_and_tools_name_the_problem(items, tools, says):
    with pytest.raises(RequestError, match=says):
        turns_of(None, parse_items(items))
        parse_tools(tools)


@pytest.mark.pure
def test_store_is_bounded_by_count_and_bytes():
    store = ResponseStore(max_responses=2, max_bytes=400)
    for i in range(3):
        assert store.put({"id": f"r{i}", "output": []}, [])
    assert store.get("r0") is None and store.get("r1") is not None and len(store) == 2
    store.put({"id": "r3", "output": []}, [])  # r2 is now the least recently used
    assert store.get("r2") is None and store.get("r1") is not None
    assert not store.put({"id": "big", "output": ["x" * 500]}, [])
    assert store.put({"id": "mid", "output": ["x" * 360]}, []) and len(store) == 1 and store.bytes <= 400
    assert store.delete("mid") and not store.delete("mid") and store.bytes == 0


# --- the official SDKs over the socket ---------------------------------------------------

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": WEATHER,
        "strict": True,
    }
]
ASSISTANT = "You are a helpful assistant."


@pytest.fixture
def oai(server):
    return client(server)


def test_create_text_is_what_chat_completions_answers(oai):
    question = "What is the capital of France? Answer with one word."  # its answer holds on every CPU (test_server)
    kw = dict(model=MODEL, instructions=ASSISTANT, input=question, temperature=0)
    messages = [{"role": "system", "content": ASSISTANT}, {"role": "user", "content": question}]
    oai.responses.create(**kw, max_output_tokens=1)
    chat = oai.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    r = oai.responses.create(**kw, max_output_tokens=24)
    assert r.id.startswith("resp_") and r.object == "response"
    # One internal request, one engine path: both are the greedy answer to the same prompt.
    gate.follows_greedy(chat.choices[0].message.content, messages, 24)
    gate.follows_greedy(r.output_text, messages, 24)
    gate.says("Paris", r.output_text, messages, 24)
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens == chat.usage.prompt_tokens > 10 and 0 < r.usage.output_tokens <= 24
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens > 0  # the prefix cache's figure
    assert r.temperature == 0 and r.max_output_tokens == 24 and r.instructions == ASSISTANT
    reason = r.incomplete_details and r.incomplete_details.reason
    if r.usage.output_tokens < 24:  # it ended by itself
        assert (r.status, reason) == ("completed", None)
    else:
        assert (r.status, reason) in (("completed", None), ("incomplete", "max_output_tokens"))


def test_stream_sends_the_typed_events_in_order(oai, server):
    kw = dict(model=MODEL, instructions=ASSISTANT, input="Name three fruits.", temperature=0, max_output_tokens=24)
    with oai.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas
    gate.one_generation(final.output_text, deltas)
    assert final.usage.output_tokens > 0 and final.status == types[-1].removeprefix("response.")
    # On the wire: each SSE event named as its type, and no [DONE] sentinel.
    with raw(server).stream("POST", "/v1/responses", json={**kw, "stream": True, "max_output_tokens": 8}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    names = [ln[len("event: ") :] for ln in lines if ln.startswith("event:")]
    data = [json.loads(ln[len("data: ") :]) for ln in lines if ln.startswith("data:")]
    assert names == [d["type"] for d in data] and names[0] == "response.created"
    assert names[-1] in ("response.completed", "response.incomplete")
    assert not any("[DONE]" in ln for ln in lines)


def test_function_call_round_trip(oai):
    question = "What is the weather in Paris?"
    # Streamed: the SDK assembles the call from its events; the stored response is what later turns continue.
    with oai.responses.stream(
        model=MODEL, input=question, tools=TOOLS, tool_choice="required", temperature=0, max_output_tokens=64
    ) as stream:
        events = list(stream)
        first = stream.get_final_response()
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    calls = [o for o in first.output if o.type == "function_call"]
    gate.one_generation(calls[0].arguments, streamed)
    kept = oai.responses.retrieve(first.id).output
    gate.written([(o.id, o.call_id, o.arguments) for o in kept], [(o.id, o.call_id, o.arguments) for o in calls])
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny and 22 C."}
    # The whole history sent back, as a stateless client does ...
    history = [{"role": "user", "content": question}, *(o.model_dump(exclude_none=True) for o in first.output)]
    kw = dict(model=MODEL, tools=TOOLS, tool_choice="none", temperature=0, max_output_tokens=24)
    answer = oai.responses.create(**kw, input=[*history, result])
    assert answer.status in ("completed", "incomplete") and answer.output_text
    assert all(o.type == "message" for o in answer.output)
    # ... or only the output, continuing the stored response: the same conversation reaches the model.
    chained = oai.responses.create(**kw, previous_response_id=first.id, input=[result])
    assert chained.usage.input_tokens == answer.usage.input_tokens and chained.output_text


def test_json_schema_output_validates(oai):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    r = oai.responses.create(
        model=MODEL, input="Describe a person as JSON.", text={"format": fmt}, temperature=0, max_output_tokens=60
    )
    jsonschema.validate(json.loads(r.output_text), schema)
    assert r.text.format.type == "json_schema"


def test_previous_response_id_get_and_delete(oai):
    first = oai.responses.create(
        model=MODEL, instructions=ASSISTANT, input="My name is Ada. Say hello.", temperature=0, max_output_tokens=12
    )
    second = oai.responses.create(
        model=MODEL, previous_response_id=first.id, input="What is my name?", temperature=0, max_output_tokens=12
    )
    assert second.previous_response_id == first.id
    # The earlier turn is in the prompt, and its KV came from the prefix cache.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    got = oai.responses.retrieve(second.id)
    assert got.id == second.id
    gate.written(got.output_text, second.output_text)  # the store gives back what it kept
    items = oai.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "message"]
    assert oai.responses.delete(second.id) is None
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.create(model=MODEL, previous_response_id=second.id, input="Again.")
    assert e.value.body["param"] == "previous_response_id"
    unstored = oai.responses.create(model=MODEL, input="Hi.", store=False, max_output_tokens=4)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unstored.id)


MALFORMED = [
    ({}, 400, "model is required"),
    ({"model": 5, "input": "hi"}, 400, "model"),
    ({"model": MODEL, "input": 5}, 400, "input"),
    ({"model": MODEL, "input": ["hi"]}, 400, "input"),
    ({"model": MODEL, "input": [{"type": "item_reference", "id": "x"}]}, 400, "item_reference"),
    ({"model": MODEL, "input": [{"role": "robot", "content": "hi"}]}, 400, "role"),
    ({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_video"}]}]}, 400, "input_video"),
    (
        {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "text only",
    ),
    ({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}, 400, "c9"),
    (
        {"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
        400,
        "JSON",
    ),
    ({"model": MODEL, "input": "hi", "previous_response_id": "resp_unknown"}, 404, "resp_unknown"),
    ({"model": MODEL, "input": "hi", "tools": [{"type": "shell_magic"}]}, 400, "shell_magic"),
    ({"model": MODEL, "input": "hi", "conversation": "conv_1"}, 400, "previous_response_id"),
    ({"model": MODEL, "input": "hi", "tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, 400, "nope"),
    ({"model": MODEL, "input": "hi", "tool_choice": "required"}, 400, "required"),
    ({"model": MODEL, "input": "hi", "tools": "get_weather"}, 400, "tools"),
    ({"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "schema"),
    ({"model": MODEL, "input": "hi", "text": {"format": {"type": "xml"}}}, 400, "format"),
    ({"model": MODEL, "input": "hi", "temperature": 5}, 400, "temperature"),
    ({"model": MODEL, "input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"model": MODEL, "input": "hi", "background": True}, 400, "background"),
    ({"model": MODEL, "input": "hi", "frobnicate": 1}, 400, "frobnicate"),
    ({"model": MODEL, "input": "hi", "metadata": {"k": 1}}, 400, "metadata"),
    ({"model": MODEL, "input": []}, 400, "input"),
    ({"model": MODEL, "input": "word " * 40_000}, 400, "context"),
    ({"model": MODEL, "input": "x" * (9 * 2**20)}, 413, "MiB"),
]


def test_malformed_bodies_are_4xx_in_openai_shape(server):
    http = raw(server)
    for body, status, says in MALFORMED:
        r = http.post("/v1/responses", json=body)
        assert r.status_code == status, (body if len(str(body)) < 300 else str(body)[:300], r.text[:500])
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert says.lower() in error["message"].lower(), (says, error)
    r = http.post("/v1/responses", content=b'{"model": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert http.get("/v1/responses/resp_nope").status_code == 404
    assert http.delete("/v1/responses/resp_nope").status_code == 404
    assert http.get("/health").status_code == 200
    ok = http.post("/v1/responses", json={"model": MODEL, "input": "Hi.", "max_output_tokens": 4})
    assert ok.status_code == 200 and ok.json()["status"] in ("completed", "incomplete")


def test_a_prompt_too_long_is_the_error_clients_act_on(server):
    """Codex acts on OpenAI's code context_length_exceeded; Claude Code reads Anthropic's 'prompt is too long:
    N tokens > M maximum'. Each API says it in its own shape, with those words and that code."""
    http = raw(server)
    long = "word " * 40_000
    for path, body in [
        ("/v1/responses", {"model": MODEL, "input": long}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": long}]}),
    ]:
        r = http.post(path, json=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded", error
        assert error["message"].startswith("prompt is too long: "), error
    r = http.post(
        "/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": long}]}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert r.json()["error"]["message"].startswith("prompt is too long: "), r.text


def test_hosted_tools_and_service_fields_are_taken_and_counted(server):
    """What Codex sends for OpenAI's own servers (a hosted web_search tool, client_metadata, prompt_cache_key)
    is answered, not refused; the stats and /metrics count each field by name."""
    http = raw(server)
    body = {
        "model": "gpt-5.1-codex",  # a model name the client picked: a server of one model answers it
        "input": "hi",
        "max_output_tokens": 2,
        "tools": [
            {"type": "web_search", "external_web_access": False},
            {"type": "file_search", "vector_store_ids": []},
        ],
        "client_metadata": {"x-codex-turn": "1"},
        "prompt_cache_key": "session-1",
    }
    before = http.get("/v1/edgeinfer/stats").json()["ignored_fields"].get("responses", {})
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("completed", "incomplete")
    after = http.get("/v1/edgeinfer/stats").json()["ignored_fields"]["responses"]
    for field in ("tools[].web_search", "tools[].file_search", "client_metadata"):
        assert after[field] == before.get(field, 0) + 1, (field, after)
    gate.contains(
        http.get("/metrics").text, 'edgeinfer_ignored_fields_total{api="responses",field="tools[].web_search"}'
    )


def test_agents_sdk_runs_a_two_tool_loop(server):
    """The Agents SDK's default model class over the socket: the model calls both tools (named in turn,
    so that the 135M model's choice is not left to chance), then answers in the agent's output type
    (text.format json_schema: free text after a tool history, a small model imitates another call)."""
    import agents
    from pydantic import BaseModel, Field

    agents.set_tracing_disabled(True)
    called: list[tuple[str, str]] = []

    class Report(BaseModel):
        weather: str = Field(max_length=40)
        time: str = Field(max_length=40)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        called.append(("get_weather", city))
        return f"Sunny and 22 C in {city}."

    @agents.function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        called.append(("get_time", city))
        return f"It is 14:05 in {city}."

    class NextTool(agents.AgentHooks):
        """After each tool, name the next one; after the last, no tool: the model answers."""

        async def on_tool_end(self, context, agent, tool, result):
            following = {"get_weather": "get_time", "get_time": "none"}[tool.name]
            agent.model_settings = agent.model_settings.resolve(agents.ModelSettings(tool_choice=following))

    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=async_client(server))
    agent = agents.Agent(
        name="assistant",
        instructions="You answer questions about cities. Use the tools, then answer.",
        model=model,
        tools=[get_weather, get_time],
        output_type=Report,
        model_settings=agents.ModelSettings(tool_choice="get_weather", temperature=0, max_tokens=80),
        reset_tool_choice=False,
        hooks=NextTool(),
    )
    result = agents.Runner.run_sync(agent, "What is the weather and the time in Paris?", max_turns=5)
    assert [name for name, _ in called] == ["get_weather", "get_time"]
    assert all(city for _, city in called)
    outputs = [item.output for item in result.new_items if isinstance(item, agents.ToolCallOutputItem)]
    assert outputs == ["Sunny and 22 C in " + called[0][1] + ".", "It is 14:05 in " + called[1][1] + "."]
    assert isinstance(result.final_output, Report) and result.final_output.weather and result.final_output.time
    assert len(result.raw_responses) == 3
