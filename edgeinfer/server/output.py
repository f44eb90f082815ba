"""The neutral event stream every API renders: a choice's engine Chunks and Finish in, its text, tool calls and end out.

Every dialect (chat completions, Responses, Messages) renders these events and nothing else;
none of them reads the model's text for tool calls itself. One ChoiceOutput per streamed
choice turns its Chunks into TextDelta events as they come, holding back text that may open a
tool call, each call as soon as the family's parser sees it complete, and its Finish into the
calls left and a Done; `whole` reads a whole answer's engine events the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.events import Chunk, Finish, TokenLogprob
from edgeinfer.formats.base import Call, CallPiece, CallStream, ToolFormat
from edgeinfer.formats.reasoning import ReasoningSplit, split
from edgeinfer.prepare import AnswerShape


@dataclass(slots=True)
class TextDelta:
    """New answer text of one choice; empty when it only carries a token's logprob (text held back)."""

    index: int  # which of the request's n choices
    text: str
    logprob: TokenLogprob | None = None  # the token's, when the request asked for logprobs


@dataclass(slots=True)
class ReasoningDelta:
    """New reasoning text of one choice (the model's thinking, apart from its answer)."""

    index: int
    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A tool call as the model writes it (families whose calls are JSON objects): the first of a call has its
    id and name and no arguments, the next ones its arguments' next text. Its ToolCall follows once complete,
    its arguments these texts joined."""

    index: int  # which choice
    call_index: int
    id: str
    name: str | None  # on the first only
    arguments: str


@dataclass(slots=True)
class ToolCall:
    """One complete tool call of a choice; sent once, after the choice's text (and its ToolCallDeltas, where it
    streamed), before its Done."""

    index: int  # which choice
    call_index: int  # 0, 1, ... within the choice
    id: str  # the model's own, or one its family's format makes (made once: every dialect sends the same id)
    name: str
    arguments: str  # JSON text
    # False for a call cut by max_tokens in a whole answer: its arguments are what was written of them (JSON cut
    # short), as a streaming client has them from the ToolCallDeltas.
    complete: bool = True


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
    reasoning_tokens: int = 0  # of the choice's tokens, those inside its thinking block


Event = TextDelta | ReasoningDelta | ToolCallDelta | ToolCall | Done


class ChoiceOutput:
    """One streamed choice: engine Chunks and its Finish to neutral events (its thinking first, then its answer)."""

    def __init__(self, shape: AnswerShape) -> None:
        self.shape = shape
        self.split = ReasoningSplit(shape.thinking, shape.started) if shape.thinking is not None else None
        self.calls = CallStream(shape.calls) if shape.calls is not None else None
        self.n_calls = 0
        self.ids: dict[int, str] = {}  # by call index: the ids of calls that streamed (the ToolCall keeps it)
        self.reasoning_tokens = 0

    def feed(self, chunk: Chunk) -> list[Event]:
        out: list[Event] = []
        text = chunk.text
        if self.split is not None:
            if self.split.thinking_now:
                self.reasoning_tokens += len(chunk.token_ids)
            reasoning, text = self.split.feed(text)
            if reasoning:
                out.append(ReasoningDelta(chunk.index, reasoning))
        calls: list[Call] = []
        if self.calls is not None:
            text, calls = self.calls.feed(text)
        if text or chunk.logprob is not None:
            out.append(TextDelta(chunk.index, text, chunk.logprob))
        out.extend(self._pieces(chunk.index))
        out.extend(self._calls(chunk.index, calls))
        return out

    def end(self, finish: Finish) -> list[Event]:
        """The thinking and text held back, the choice's calls not sent yet; then its Done."""
        out: list[Event] = []
        text = ""
        if self.split is not None:
            reasoning, text = self.split.end()
            if reasoning:
                out.append(ReasoningDelta(finish.index, reasoning))
        if self.calls is not None and finish.finish_reason in ("stop", "length"):
            _, content = _split(finish.text, self.shape)
            text, calls = self.calls.feed(text)
            rest, more = self.calls.end(content)
            text += rest
            calls += more
        else:
            calls = []
        if text:
            out.append(TextDelta(finish.index, text))
        out.extend(self._pieces(finish.index))
        out.extend(self._calls(finish.index, calls))
        out.append(_done(finish, self.n_calls > 0, self.reasoning_tokens, self.shape.turn_end))
        return out

    def _pieces(self, index: int) -> list[ToolCallDelta]:
        if self.calls is None:
            return []
        return [self._piece(index, p) for p in self.calls.take_pieces()]

    def _piece(self, index: int, p: CallPiece) -> ToolCallDelta:
        assert self.shape.calls is not None
        if p.call_index not in self.ids:
            self.ids[p.call_index] = self.shape.calls.new_id()
        return ToolCallDelta(index, p.call_index, self.ids[p.call_index], p.name, p.arguments)

    def _calls(self, index: int, calls: list[Call]) -> list[ToolCall]:
        fmt = self.shape.calls
        assert fmt is not None or not calls
        out = []
        for c in calls:
            k, streamed = self.n_calls, self.ids.get(self.n_calls)
            out.append(ToolCall(index, k, streamed, c.name, c.arguments) if streamed else _event(fmt, index, k, c))  # type: ignore[arg-type]
            self.n_calls += 1
        return out


def whole(chunks: list[Chunk], finish: Finish, shape: AnswerShape) -> list[Event]:
    """A choice answered in one piece: its engine events read as a stream reads them.

    The whole answer is the streamed one collected, so text, reasoning, calls, usage and the finish
    reason cannot differ between the two."""
    out = ChoiceOutput(shape)
    events = [ev for chunk in chunks for ev in out.feed(chunk)] + out.end(finish)
    return events[:-1] + _cut_calls(events) + events[-1:]


def _cut_calls(events: list[Event]) -> list[ToolCall]:
    """The calls that began streaming and never completed (cut by max_tokens), as what was written of them."""
    done = {ev.call_index for ev in events if isinstance(ev, ToolCall)}
    cut: dict[int, ToolCall] = {}
    for ev in events:
        if isinstance(ev, ToolCallDelta) and ev.call_index not in done:
            if ev.call_index not in cut:
                cut[ev.call_index] = ToolCall(ev.index, ev.call_index, ev.id, ev.name or "", "", complete=False)
            cut[ev.call_index].arguments += ev.arguments
    return list(cut.values())


def _split(text: str, shape: AnswerShape) -> tuple[str | None, str]:
    return split(text, shape.thinking, shape.started) if shape.thinking is not None else (None, text)


def _event(fmt: ToolFormat, index: int, call_index: int, call: Call) -> ToolCall:
    return ToolCall(index, call_index, fmt.call_id(call), call.name, call.arguments)


def _done(finish: Finish, called: bool, reasoning_tokens: int = 0, turn_end: int | None = None) -> Done:
    reason = finish.finish_reason  # stop | length | cancelled | error
    if reason == "length" and turn_end is not None and finish.stats.completion_tokens == turn_end:
        reason = "stop"  # the server ended a base model's turn
    if reason == "stop" and called:
        reason = "tool_calls"
    elif reason == "stop" and finish.stop_sequence is not None:
        reason = "stop_sequence"
    return Done(finish.index, reason, finish, finish.stop_sequence, reasoning_tokens)
