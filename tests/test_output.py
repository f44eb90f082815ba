"""The neutral event stream (server/output.py) and its rendering by the streaming code, without a model."""

from __future__ import annotations

import asyncio
import json

import pytest

from edgeinfer.engine.text import TextStream
from edgeinfer.events import Chunk, Finish, StreamStats, TokenLogprob
from edgeinfer.formats.hermes import Hermes
from edgeinfer.server.openai_chat import ChatDialect, CompletionDialect
from edgeinfer.server.output import PLAIN, AnswerShape, ChoiceOutput, Done, TextDelta, ToolCall, whole
from edgeinfer.server.state import ServerState
from edgeinfer.server.streaming import _sse

pytestmark = pytest.mark.pure

TOOLS = AnswerShape(calls=Hermes())
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def finish(text: str, reason: str = "stop", index: int = 0, stop: str | None = None, **kw) -> Finish:
    stats = StreamStats(prompt_tokens=7, cached_tokens=3, completion_tokens=5, ttft_s=0.1, decode_tps=50.0, total_s=0.2)
    return Finish(index, reason, text, [1, 2, 3, 4, 5], stats, stop_sequence=stop, **kw)


def chunk(text: str, index: int = 0, lp: TokenLogprob | None = None) -> Chunk:
    return Chunk(index, text, [1], 0.0, lp)


def test_plain_text_streams_as_it_comes():
    out = ChoiceOutput(PLAIN)
    assert out.feed(chunk("Hel")) == [TextDelta(0, "Hel")]
    assert out.feed(chunk("")) == []
    lp = TokenLogprob(5, "", -0.1, [])
    assert out.feed(chunk("", lp=lp)) == [TextDelta(0, "", lp)]  # a token held whole still carries its logprob
    f = finish("Hello")
    assert out.end(f) == [Done(0, "stop", f)]


def test_tool_calls_are_held_back_and_sent_once_at_the_end():
    out = ChoiceOutput(TOOLS)
    events = [
        ev for piece in ["Let me look. <tool", "_call>\n{", '"name": "get_weather"'] for ev in out.feed(chunk(piece))
    ]
    assert events == [TextDelta(0, "Let me look. ")]
    f = finish("Let me look. " + CALL)
    *calls, done = out.end(f)
    assert [(c.call_index, c.name, json.loads(c.arguments)) for c in calls] == [(0, "get_weather", {"city": "Oslo"})]
    assert all(isinstance(c, ToolCall) and c.id.startswith("call_") and len(c.id) == 29 for c in calls)
    assert done == Done(0, "tool_calls", f)
    # The whole answer: the same calls and end, the text before them trimmed.
    before, call, end = whole(f, TOOLS)
    assert before == TextDelta(0, "Let me look.") and end == done
    assert isinstance(call, ToolCall) and (call.name, call.arguments) == (calls[0].name, calls[0].arguments)


def test_text_that_only_looked_like_a_call_is_sent_at_the_end():
    out = ChoiceOutput(TOOLS)
    assert out.feed(chunk("a <tool")) == [TextDelta(0, "a ")]
    assert out.end(finish("a <tool")) == [TextDelta(0, "<tool"), Done(0, "stop", finish("a <tool"))]


def test_a_call_cut_by_max_tokens_is_no_call():
    f = finish('<tool_call>\n{"name": "get_we', "length")
    assert [type(ev) for ev in whole(f, TOOLS)] == [TextDelta, Done]
    assert whole(f, TOOLS)[-1].reason == "length"


def test_done_reasons():
    assert whole(finish("x", stop="END"), PLAIN)[-1] == Done(0, "stop_sequence", finish("x", stop="END"), "END")
    assert whole(finish("x", "cancelled"), TOOLS)[-1].reason == "cancelled"
    failed = finish("", "error", error="boom")
    assert whole(failed, PLAIN) == [Done(0, "error", failed)]
    assert whole(finish(CALL, stop="END"), TOOLS)[-1].reason == "tool_calls"


def test_the_text_stream_says_which_stop_string_matched():
    text = TextStream(["END", "STOP", "ST"])
    assert text.feed(b"abc S") == "abc "
    assert text.feed(b"TOP and END") == ""
    assert text.stopped and text.stop_hit == "STOP" and text.text == "abc "  # the earliest, first listed on a tie
    assert TextStream(["x"]).stop_hit is None


class FakeHandle:
    def __init__(self, events):
        self.events = events
        self.cancelled = False

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for ev in self.events:
            yield ev

    def cancel(self):
        self.cancelled = True


def sse(dialect, handles, shape):
    async def run():
        return [item async for item in _sse(handles, dialect, shape, ServerState(lambda: None, "m", None))]

    return asyncio.run(run())


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
    (calls, none), end = deltas[2:]
    assert none is None and [c["function"]["name"] for c in calls["tool_calls"]] == ["get_weather"]
    assert calls["tool_calls"][0]["index"] == 0 and calls["tool_calls"][0]["id"].startswith("call_")
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
    events = whole(f, PLAIN)
    body = dialect.response([events[-1]], events)
    assert body["choices"][0]["text"] == "Paris" and body["choices"][0]["finish_reason"] == "stop"
