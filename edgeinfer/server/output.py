"""The neutral event stream every API renders: a choice's engine Chunks and Finish in, its text, tool calls and end out.

Every dialect (chat completions, Responses, Messages) renders these events and nothing else;
none of them reads the model's text for tool calls itself. One ChoiceOutput per streamed
choice turns its Chunks into TextDelta events as they come, holding back text that may open a
tool call, and its Finish into the calls and a Done; `whole` gives the same events for an
answer sent in one piece.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from edgeinfer.events import Chunk, Finish, TokenLogprob
from edgeinfer.server.tools import CallWatch, parse_calls


@dataclass(slots=True)
class TextDelta:
    """New answer text of one choice; empty when it only carries a token's logprob (text held back)."""

    index: int  # which of the request's n choices
    text: str
    logprob: TokenLogprob | None = None  # the token's, when the request asked for logprobs


@dataclass(slots=True)
class ReasoningDelta:
    """New reasoning text of one choice (the model's thinking, apart from its answer); issue 28 fills it."""

    index: int
    text: str


@dataclass(slots=True)
class ToolCall:
    """One complete tool call of a choice; sent once, after the choice's text, before its Done."""

    index: int  # which choice
    call_index: int  # 0, 1, ... within the choice
    id: str  # "call_" + 24 hex digits, made once here: every dialect sends the same id
    name: str
    arguments: str  # JSON text


@dataclass(slots=True)
class Done:
    """The end of one choice, always its last event.

    reason: "stop" (the model ended its text), "stop_sequence" (a client's stop string matched;
    stop_sequence says which), "length" (max tokens), "tool_calls" (it ended on calls),
    "cancelled" (client gone or shutdown), "error" (finish.error says why)."""

    index: int
    reason: str
    finish: Finish  # the engine's, with the text, token ids, logprobs and stats (usage)
    stop_sequence: str | None = None


Event = TextDelta | ReasoningDelta | ToolCall | Done


class ChoiceOutput:
    """One streamed choice: engine Chunks and its Finish to neutral events."""

    def __init__(self, tools: bool) -> None:
        self.tools = tools  # the answer may hold tool calls: hold back what may open one, parse them at the end
        self.watch = CallWatch()

    def feed(self, chunk: Chunk) -> list[Event]:
        text = self.watch.feed(chunk.text) if self.tools else chunk.text
        if not text and chunk.logprob is None:
            return []
        return [TextDelta(chunk.index, text, chunk.logprob)]

    def end(self, finish: Finish) -> list[Event]:
        """The choice's tool calls, or else the text held back in case it opened one; then its Done."""
        _, calls = _calls(finish, self.tools)
        out: list[Event] = list(calls)
        if not calls and self.tools and (rest := self.watch.rest()):
            out.append(TextDelta(finish.index, rest))
        out.append(_done(finish, bool(calls)))
        return out


def whole(finish: Finish, tools: bool) -> list[Event]:
    """A choice answered in one piece: its text (the text before any call, trimmed), its calls, its Done."""
    before, calls = _calls(finish, tools)
    out: list[Event] = [TextDelta(finish.index, before)] if before else []
    out.extend(calls)
    out.append(_done(finish, bool(calls)))
    return out


def _calls(finish: Finish, tools: bool) -> tuple[str | None, list[ToolCall]]:
    """The text before any call, and the complete calls (one cut by max_tokens is left out)."""
    if not tools or finish.finish_reason not in ("stop", "length"):
        return finish.text, []
    before, found = parse_calls(finish.text)
    calls = [ToolCall(finish.index, i, f"call_{uuid.uuid4().hex[:24]}", n, a) for i, (n, a) in enumerate(found)]
    return before, calls


def _done(finish: Finish, called: bool) -> Done:
    reason = finish.finish_reason  # stop | length | cancelled | error
    if reason == "stop" and called:
        reason = "tool_calls"
    elif reason == "stop" and finish.stop_sequence is not None:
        reason = "stop_sequence"
    return Done(finish.index, reason, finish, finish.stop_sequence)
