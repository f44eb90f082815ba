"""The neutral event stream (server/output.py) and its rendering by the streaming code, without a model."""

from __future__ import annotations

import asyncio
import json

import pytest

from edgeinfer.engine.text import TextStream
from edgeinfer.events import Chunk, Finish, StreamStats, TokenLogprob
from edgeinfer.formats.hermes import Hermes
from edgeinfer.formats.reasoning import Thinking
from edgeinfer.prepare import PLAIN, AnswerShape
from edgeinfer.server import sse as sse_module
from edgeinfer.server.messages import MessagesDialect
from edgeinfer.server.openai_chat import ChatDialect, CompletionDialect
from edgeinfer.server.output import ChoiceOutput, Done, TextDelta, ToolCall, ToolCallDelta, whole
from edgeinfer.server.responses_render import ResponsesDialect
from edgeinfer.server.sse import EventStream, encode
from edgeinfer.server.state import ServerState
from edgeinfer.server.streaming import _sse, respond

pytestmark = pytest.mark.pure

TOOLS = AnswerShape(calls=Hermes())
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def finish(text: str, reason: str = "stop", index: int = 0, stop: str | None = None, **kw) -> Finish:
    stats = StreamStats(prompt_tokens=7, cached_tokens=3, completion_tokens=5, ttft_s=0.1, decode_tps=50.0, total_s=0.2)
    return Finish(index, reason, text, [1, 2, 3, 4, 5], stats, stop_sequence=stop, **kw)


def chunk(text: str, index: int = 0, lp: TokenLogprob | None = None) -> Chunk:
    return Chunk(index, text, [1], 0.0, lp)


def whole_of(f: Finish, shape: AnswerShape):
    """The whole answer of a Finish whose text came in one chunk."""
    return whole([chunk(f.text, f.index)] if f.text else [], f, shape)


def test_plain_text_streams_as_it_comes():
    out = ChoiceOutput(PLAIN)
    assert out.feed(chunk("Hel")) == [TextDelta(0, "Hel")]
    assert out.feed(chunk("")) == []
    lp = TokenLogprob(5, "", -0.1, [])
    assert out.feed(chunk("", lp=lp)) == [TextDelta(0, "", lp)]  # a token held whole still carries its logprob
    f = finish("Hello")
    assert out.end(f) == [Done(0, "stop", f)]


def test_a_call_streams_its_arguments_as_written_then_comes_whole():
    out = ChoiceOutput(TOOLS)
    pieces = ["Let me look. <tool", "_call>\n{", '"name": "get_weather"', ', "arguments": {"ci', 'ty": "Os', "lo"]
    events = [ev for piece in pieces for ev in out.feed(chunk(piece))]
    assert events[0] == TextDelta(0, "Let me look. ")
    first, *deltas = events[1:]
    assert isinstance(first, ToolCallDelta) and (first.call_index, first.name, first.arguments) == (
        0,
        "get_weather",
        "",
    )
    assert first.id.startswith("call_") and len(first.id) == 29
    assert all(isinstance(d, ToolCallDelta) and d.name is None and d.id == first.id for d in deltas)
    assert [d.arguments for d in deltas] == ['{"ci', 'ty": "Os', "lo"]  # as written, one space after each ':'
    f = finish("Let me look. " + CALL)
    *rest, call, done = out.end(f)
    assert [d.arguments for d in rest] == ['"}']
    assert isinstance(call, ToolCall) and (call.id, call.name, call.arguments) == (
        first.id,
        "get_weather",
        '{"city": "Oslo"}',
    )
    assert "".join(d.arguments for d in [*deltas, *rest]) == call.arguments
    assert done == Done(0, "tool_calls", f)
    # The whole answer is the same read of the same chunks: the same text, call and end.
    again = whole([chunk(piece) for piece in pieces], f, TOOLS)
    assert [ev for ev in again if isinstance(ev, TextDelta)] == [TextDelta(0, "Let me look. ")] and again[-1] == done
    (whole_call,) = [ev for ev in again if isinstance(ev, ToolCall)]
    assert (whole_call.name, whole_call.arguments, whole_call.complete) == (call.name, call.arguments, True)


@pytest.mark.parametrize("cut", range(1, len(CALL)))
def test_streamed_arguments_join_to_the_whole_call_wherever_the_text_is_cut(cut):
    """However the text arrives, the pieces join to the arguments the whole answer has (in their one form:
    no space but one after each ':' and ',', strings as the model wrote them)."""
    text = 'Hi <tool_call>\n{"name":"f","arguments":{ "a" :[1, 2],"b":"x, y: \\"z\\""}}\n</tool_call>'
    out = ChoiceOutput(TOOLS)
    events = out.feed(chunk(text[:cut])) + out.feed(chunk(text[cut:])) + out.end(finish(text))
    args = "".join(ev.arguments for ev in events if isinstance(ev, ToolCallDelta))
    (call,) = [ev for ev in events if isinstance(ev, ToolCall)]
    assert args == call.arguments == '{"a": [1, 2], "b": "x, y: \\"z\\""}'
    assert json.loads(args) == {"a": [1, 2], "b": 'x, y: "z"'}
    (whole_call,) = [ev for ev in whole_of(finish(text), TOOLS) if isinstance(ev, ToolCall)]
    assert whole_call.arguments == call.arguments


def test_a_streamed_call_cut_by_max_tokens_stays_a_call():
    """Once a call's name and arguments went out, the text is not sent again as content when it is cut."""
    out = ChoiceOutput(TOOLS)
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os'
    events = out.feed(chunk(cut)) + out.end(finish(cut, "length"))
    assert not [ev for ev in events if isinstance(ev, TextDelta) and ev.text]
    assert "".join(ev.arguments for ev in events if isinstance(ev, ToolCallDelta)) == '{"city": "Os'
    assert events[-1].reason == "length"


def test_text_that_only_looked_like_a_call_is_sent_at_the_end():
    out = ChoiceOutput(TOOLS)
    assert out.feed(chunk("a <tool")) == [TextDelta(0, "a ")]
    assert out.end(finish("a <tool")) == [TextDelta(0, "<tool"), Done(0, "stop", finish("a <tool"))]


def test_a_call_cut_by_max_tokens_before_its_name_is_text():
    f = finish('<tool_call>\n{"name": "get_we', "length")
    assert [type(ev) for ev in whole_of(f, TOOLS)] == [TextDelta, Done]
    assert whole_of(f, TOOLS)[-1].reason == "length"


def test_a_whole_answer_has_a_call_cut_after_its_name_as_written():
    """As a streaming client has it from the deltas: the call, its arguments as far as written, incomplete."""
    f = finish('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os', "length")
    *_, call, done = whole_of(f, TOOLS)
    assert isinstance(call, ToolCall) and (call.name, call.arguments, call.complete) == (
        "get_weather",
        '{"city": "Os',
        False,
    )
    assert done.reason == "length"


def test_done_reasons():
    assert whole_of(finish("x", stop="END"), PLAIN)[-1] == Done(0, "stop_sequence", finish("x", stop="END"), "END")
    assert whole_of(finish("x", "cancelled"), TOOLS)[-1].reason == "cancelled"
    failed = finish("", "error", error="boom")
    assert whole_of(failed, PLAIN) == [Done(0, "error", failed)]
    assert whole_of(finish(CALL, stop="END"), TOOLS)[-1].reason == "tool_calls"


def test_the_text_stream_says_which_stop_string_matched():
    text = TextStream(["END", "STOP", "ST"])
    assert text.feed(b"abc S") == "abc "
    assert text.feed(b"TOP and END") == ""
    assert text.stopped and text.stop_hit == "STOP" and text.text == "abc "  # the earliest, first listed on a tie
    assert TextStream(["x"]).stop_hit is None


class FakeHandle:
    """A stream's events, each in a group of its own unless `groups` says how many go in each."""

    finish = None

    def __init__(self, events, groups=None):
        self.events = events
        self.groups = groups or [1] * len(events)
        self.cancelled = False

    async def batches(self):
        at = 0
        for n in self.groups:
            group = self.events[at : at + n]
            at += n
            if isinstance(group[-1], Finish):
                self.finish = group[-1]
            yield group

    def cancel(self):
        self.cancelled = True


def sse_chunks(dialect, handles, shape):
    """What _sse writes to the socket, chunk by chunk."""

    async def run():
        return [chunk async for chunk in _sse(handles, dialect, shape, ServerState(lambda: None, "m", None))]

    return asyncio.run(run())


def parse_sse(text):
    """SSE text back into its events, as a client reads them: {"event": name, "data": text}, "event" when named."""
    events = []
    for block in text.split("\n\n")[:-1]:
        item, data = {}, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            if field == "event":
                item["event"] = value
            elif field == "data":
                data.append(value)
        events.append({**item, "data": "\n".join(data)})
    return events


def sse(dialect, handles, shape):
    return parse_sse(b"".join(sse_chunks(dialect, handles, shape)).decode())


def test_chat_stream_shape():
    """The chunks a streamed chat answer is made of, in order: what tests/test_server.py and the SDKs rely on."""
    dialect = ChatDialect("m", logprobs=False, include_usage=True)
    handles = [FakeHandle([chunk("Sure. "), chunk("<tool_call>"), finish("Sure. " + CALL)])]
    items = sse(dialect, handles, TOOLS)
    assert all(set(item) == {"data"} for item in items) and items[-1] == {"data": "[DONE]"}
    chunks = [json.loads(item["data"]) for item in items[:-1]]
    assert {c["id"] for c in chunks} == {dialect.id} and {c["object"] for c in chunks} == {"chat.completion.chunk"}
    deltas = [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) for c in chunks[:-1]]
    assert deltas[:2] == [({"role": "assistant", "content": ""}, None), ({"content": "Sure. "}, None)]
    # The call as it is written: its id and name first, then its arguments in pieces, joined the whole call's.
    (named, none), *pieces, end = deltas[2:]
    assert none is None and named["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert named["tool_calls"][0]["index"] == 0 and named["tool_calls"][0]["id"].startswith("call_")
    assert all(list(p["tool_calls"][0]) == ["index", "function"] for p, _ in pieces)
    assert "".join(p["tool_calls"][0]["function"]["arguments"] for p, _ in pieces) == '{"city": "Oslo"}'
    assert end == ({}, "tool_calls")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 7
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}


def test_a_failed_stream_sends_an_error_then_its_end():
    handles = [FakeHandle([chunk("a"), finish("a", "error", error="the engine broke")])]
    items = [json.loads(i["data"]) for i in sse(ChatDialect("m", False), handles, PLAIN)[:-1]]
    assert items[2]["error"]["message"] == "the engine broke" and items[2]["error"]["type"] == "server_error"
    assert items[3]["choices"][0]["finish_reason"] == "stop"


def test_completions_stream_and_whole_agree():
    dialect = CompletionDialect("m", logprobs=False, include_usage=False)
    handles = [FakeHandle([chunk("Par"), chunk("is"), finish("Paris", stop=".")])]
    items = sse(dialect, handles, PLAIN)
    texts = [json.loads(i["data"])["choices"][0] for i in items[:-1]]
    assert [t["text"] for t in texts] == ["Par", "is", ""] and texts[-1]["finish_reason"] == "stop"
    f = finish("Paris", stop=".")
    events = whole([chunk("Par"), chunk("is")], f, PLAIN)
    body = dialect.response([events[-1]], events)
    assert body["choices"][0]["text"] == "Paris" and body["choices"][0]["finish_reason"] == "stop"


def test_only_the_arguments_key_streams_for_hermes():
    """What streams is what the whole call carries: a Hermes call's arguments are its "arguments" only (a call
    written with another key comes whole, with the arguments its parser reads)."""
    text = '<tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>'
    out = ChoiceOutput(TOOLS)
    events = out.feed(chunk(text)) + out.end(finish(text))
    deltas = [ev for ev in events if isinstance(ev, ToolCallDelta)]
    (call,) = [ev for ev in events if isinstance(ev, ToolCall)]
    assert deltas == [] and (call.name, call.arguments) == ("f", "{}")


class Connected:
    async def is_disconnected(self):
        return False


THINKING = AnswerShape(calls=Hermes(), thinking=Thinking())
PIECES = ["<think>", "Rain is ", "likely.", "</think>", "Let me look. ", "<tool_call>", CALL[len("<tool_call>") :]]


def both(make, shape=THINKING, pieces=PIECES):
    """The same engine events answered streamed (SSE data, parsed) and whole (the JSON body)."""
    events = [chunk(p) for p in pieces] + [finish("".join(pieces))]
    streamed = [json.loads(i["data"]) for i in sse(make(), [FakeHandle(events)], shape) if i["data"] != "[DONE]"]
    state = ServerState(lambda: None, "m", None)
    body = asyncio.run(respond(Connected(), state, [FakeHandle(events)], make(), False, shape))
    return streamed, body


def test_chat_whole_and_streamed_answers_agree():
    streamed, body = both(lambda: ChatDialect("m", logprobs=False, include_usage=True))
    deltas = [c["choices"][0]["delta"] for c in streamed if c["choices"]]
    calls = [tc["function"] for d in deltas for tc in d.get("tool_calls", [])]
    (message,) = [c["message"] for c in body["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"] == "Rain is likely."
    assert "".join(d.get("content") or "" for d in deltas) == message["content"] == "Let me look. "
    assert [(calls[0]["name"], "".join(c["arguments"] for c in calls))] == [
        (tc["function"]["name"], tc["function"]["arguments"]) for tc in message["tool_calls"]
    ]
    assert streamed[-1]["usage"] == body["usage"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 3  # the two thoughts and </think>
    assert [c["choices"][0]["finish_reason"] for c in streamed if c["choices"]][-1] == "tool_calls"
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def without_ids(obj):
    if isinstance(obj, dict):
        return {k: without_ids(v) for k, v in obj.items() if k not in ("id", "call_id", "created_at")}
    if isinstance(obj, list):
        return [without_ids(v) for v in obj]
    return obj


def test_responses_whole_and_streamed_answers_agree():
    streamed, body = both(lambda: ResponsesDialect("m", {}))
    (completed,) = [ev["response"] for ev in streamed if ev["type"] == "response.completed"]
    assert without_ids(completed) == without_ids(body)
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
    assert [item["type"] for item in body["output"]] == ["reasoning", "message", "function_call"]


def test_messages_whole_and_streamed_answers_agree():
    streamed, body = both(lambda: MessagesDialect("m"))
    blocks = []
    for ev in streamed:
        if ev["type"] == "content_block_start":
            blocks.append(dict(ev["content_block"]))
        elif ev["type"] == "content_block_delta":
            delta, block = ev["delta"], blocks[ev["index"]]
            for key in ("text", "thinking", "signature", "partial_json"):
                if key in delta:
                    block[key] = block.get(key, "") + delta[key]
    for block in blocks:
        if block["type"] == "tool_use":
            block["input"] = json.loads(block.pop("partial_json"))
    assert without_ids(blocks) == without_ids(body["content"])
    (delta,) = [ev for ev in streamed if ev["type"] == "message_delta"]
    assert delta["usage"] == body["usage"] and delta["delta"]["stop_reason"] == body["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    "make", [lambda: ChatDialect("m", False), lambda: ResponsesDialect("m", {}), lambda: MessagesDialect("m")]
)
def test_a_call_cut_by_max_tokens_is_the_same_call_whole_and_streamed(make):
    cut = ["<tool_call>\n{", '"name": "get_weather", ', '"arguments": {"city": "Os']
    events = [chunk(p) for p in cut] + [finish("".join(cut), "length")]
    state = ServerState(lambda: None, "m", None)
    body = asyncio.run(respond(Connected(), state, [FakeHandle(events)], make(), False, TOOLS))
    text = json.dumps(body)
    assert "get_weather" in text and "<tool_call>" not in text  # a call, as streamed, never its raw text
    if "content" in body and isinstance(body["content"], list):  # Messages: the input as far as written
        assert body["content"][0]["input"] == {"city": "Os"} and body["stop_reason"] == "max_tokens"
    elif "output" in body:  # Responses: an incomplete function_call item
        assert body["output"][-1]["status"] == "incomplete" and body["output"][-1]["arguments"] == '{"city": "Os'
    else:
        assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Os'
        assert body["choices"][0]["finish_reason"] == "length"


def test_events_that_came_together_go_out_in_one_write():
    """A step's tokens reach the stream together (speculation's accepted drafts): one chunk to the socket, not
    one a token; the Finish and the usage after it are one more each."""
    events = [chunk("a"), chunk("b"), chunk("c"), finish("abc")]
    written = sse_chunks(ChatDialect("m", False, include_usage=True), [FakeHandle(events, [3, 1])], PLAIN)
    per_write = [parse_sse(w.decode()) for w in written]
    assert [len(items) for items in per_write] == [1, 3, 1, 2]  # role; the three tokens; the end; usage, [DONE]
    texts = [json.loads(item["data"])["choices"][0]["delta"]["content"] for item in per_write[1]]
    assert texts == ["a", "b", "c"] and per_write[-1][-1] == {"data": "[DONE]"}


def test_sse_encoding_names_events_and_splits_lines():
    assert encode([{"data": "[DONE]"}]) == b"data: [DONE]\n\n"
    two = encode([{"event": "message_stop", "data": '{"a": 1}'}, {"data": "one\ntwo"}])
    assert two == b'event: message_stop\ndata: {"a": 1}\n\ndata: one\ndata: two\n\n'
    assert parse_sse(two.decode())[1] == {"data": "one\ntwo"}


def asgi_run(response, client_leaves_after=None, stuck_at=None, then=lambda: None, sent=None):
    """Run an ASGI response against a client that reads everything (a write that blocks forever from the
    `stuck_at`th on: a full socket), and leaves after client_leaves_after seconds if told; returns what was
    sent (into `sent` as it comes, when given), and what then() says as the response returns (before
    asyncio.run closes what is left)."""
    sent = [] if sent is None else sent

    async def receive():
        if client_leaves_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(client_leaves_after)
        return {"type": "http.disconnect"}

    async def send(message):
        if stuck_at is not None and len(sent) >= stuck_at:
            await asyncio.Event().wait()
        sent.append(message)

    async def main():
        scope = {"type": "http", "method": "POST", "asgi": {"version": "3.0", "spec_version": "2.3"}}
        await response(scope, receive, send)
        return then()

    return sent, asyncio.run(main())


def test_an_event_stream_pings_while_nothing_comes(monkeypatch):
    """A long prompt sends nothing for a while: a comment every PING_S keeps a client's read timeout away."""
    monkeypatch.setattr(sse_module, "PING_S", 0.02)
    sent = []

    async def slow():
        # Silent until three pings went out (however slowly a busy machine runs the timers); at most 10 s.
        yield b"data: 1\n\n"
        for _ in range(1000):
            if sum(m.get("body") == sse_module.PING for m in sent) >= 3:
                break
            await asyncio.sleep(0.01)
        yield b"data: 2\n\n"

    asgi_run(EventStream(slow()), sent=sent)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies[0] == b"data: 1\n\n" and bodies[-2:] == [b"data: 2\n\n", b""]
    assert set(bodies[1:-2]) == {sse_module.PING} and len(bodies[1:-2]) >= 3
    assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")


def test_a_client_leaving_mid_write_closes_the_stream_at_once():
    """The client goes while a write is stuck (the generator waits at its yield): the generator's cleanup
    (cancelling the engine's streams) runs as the response ends, not at garbage collection."""
    cleaned = []

    async def tokens():
        try:
            while True:
                yield b"data: x\n\n"
        finally:
            cleaned.append(True)

    sent, cleaned_by_then = asgi_run(
        EventStream(tokens()), client_leaves_after=0.05, stuck_at=2, then=lambda: list(cleaned)
    )
    assert cleaned_by_then == [True] and [m.get("body") for m in sent] == [None, b"data: x\n\n"]
