"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

A request is translated at the door into the one internal request (edgeinfer.request.ChatInput: a
system turn, assistant turns whose tool_use blocks become past calls with their ids, tool_result
blocks become tool turns with the id they answer; errors name Anthropic's fields) and runs through
the same path as chat completions
(run.run_chat: template, grammar, packed decode, prefix cache). What comes back is the neutral
event stream of server/output.py, rendered here as Anthropic's message or its SSE events; nothing
here reads the model's text for tool calls.

usage.input_tokens counts the prompt tokens the engine computed, as Anthropic counts them:
the tokens restored from the prefix cache are cache_read_input_tokens, apart (their sum is the
prompt's length, what count_tokens returns); cache_creation_input_tokens is always 0, since
every prompt is kept for reuse without being asked.

Every error on these paths is in Anthropic's envelope, {"type": "error", "error": {"type", "message"}}:
its Api (the end of this module) gives it for /v1/messages and below, which the app's handlers follow.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic_core import from_json

from edgeinfer.errors import RequestError
from edgeinfer.options import Grammar, SamplingParams
from edgeinfer.prepare import prepare
from edgeinfer.request import ChatInput, PastCall, Tool, Turn
from edgeinfer.server.api import Api
from edgeinfer.server.lenient import ignored_fields
from edgeinfer.server.messages_schema import (
    CountTokensRequest,
    MessageParam,
    MessagesBody,
    MessagesRequest,
    TextBlock,
    ThinkingConfig,
    ToolResultBlock,
    ToolUseBlock,
)
from edgeinfer.server.output import Done, Event, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta
from edgeinfer.server.pool import loaded
from edgeinfer.server.run import run_chat
from edgeinfer.server.state import authorized, server_state

# --- errors ---------------------------------------------------------------------

# Anthropic's error type for each HTTP status edgeinfer answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # queue full, model loading, shutting down: worth a retry
}


def error_body(
    status: int, message: str, type_: str = "", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """Anthropic's error envelope; its error type follows from the status (type_, param and code,
    OpenAI's vocabulary, are what the app's handlers know: the message already names the field)."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


# --- the request, translated ----------------------------------------------------

SEPARATOR = "\n\n"  # between the text blocks of one message or of the system prompt
# Claude Code opens its system prompt with this line for Anthropic's billing. Its figures have changed
# from one request to the next in some versions: kept, it would make every turn's prompt new from its
# first tokens and cost the whole prefix cache. It means nothing here, so it is taken out.
BILLING_HEADER = "x-anthropic-billing-header:"


def system_text(system: str | list[TextBlock] | None) -> str:
    """The system prompt's text, Claude Code's billing line taken out."""
    blocks = [system] if isinstance(system, str) else [b.text for b in system or []]
    kept = []
    for text in blocks:
        lines = [ln for ln in text.split("\n") if not ln.startswith(BILLING_HEADER)]
        if any(ln.strip() for ln in lines):
            kept.append("\n".join(lines))
    return SEPARATOR.join(kept)


def ignored_in(body: MessagesBody) -> list[str]:
    """The fields (and Claude Code's billing line) of a body that change nothing here, for the stats."""
    found = ignored_fields(body)
    blocks = [body.system] if isinstance(body.system, str) else [b.text for b in body.system or []]
    if any(BILLING_HEADER in text for text in blocks):
        found.append("system.x-anthropic-billing-header")
    return found


def to_input(body: MessagesBody) -> ChatInput:
    """The internal request a Messages body stands for (max_tokens and sampling only from a MessagesRequest)."""
    turns: list[Turn] = []
    system = system_text(body.system)
    if system:
        turns.append(Turn("system", system))
    calls: dict[str, str] = {}  # the tool_use ids made so far, to their tool's name: a tool_result answers one
    for i, m in enumerate(body.messages):
        turns.extend(_turn(i, m, calls))
    # A deferred tool is not shown to the model until the client loads it.
    tools = [
        Tool(t.name, t.description, t.input_schema, f"tools.{i}.input_schema")
        for i, t in enumerate(body.tools or [])
        if not t.defer_loading
    ]
    choice, forced = body.tool_choice, None
    if choice is not None and choice.type == "tool":
        forced = choice.name
        if forced not in [t.name for t in tools]:  # named, but deferred
            raise RequestError(
                f"tool_choice names {forced!r}, a tool with defer_loading: load it before forcing it",
                "tool_choice.name",
            )
    if choice is not None and choice.type == "any" and not tools:
        raise RequestError('tool_choice {"type": "any"} needs a tool without defer_loading', "tool_choice")
    answer_format = None
    if body.output_config is not None and body.output_config.format is not None:
        source = json.dumps(body.output_config.format.schema_)
        answer_format = Grammar(kind="json_schema", source=source, origin="output_config.format.schema")
    sampling, named = SamplingParams(), frozenset[str]()
    if isinstance(body, MessagesRequest):
        # Unset sampling fields keep edgeinfer's defaults (and the model's recommended ones), as in chat completions.
        chosen = {k: getattr(body, k) for k in ("temperature", "top_p", "top_k") if getattr(body, k) is not None}
        stop = list(body.stop_sequences or [])
        sampling = SamplingParams(max_tokens=body.max_tokens, stop=stop, ignore_eos=body.ignore_eos, **chosen)
        named = frozenset(chosen)
    return ChatInput(
        model=body.model,
        turns=turns,
        sampling=sampling,
        named=named,
        tools=tools,
        tool_choice=CHOICES[choice.type] if choice is not None else "auto",
        forced=forced,
        # Anthropic's default is parallel calls; disable_parallel_tool_use holds the answer to one.
        parallel_calls=bool(tools) and forced is None and not (choice is not None and choice.disable_parallel_tool_use),
        answer_format=answer_format,
        reasoning_budget=thinking_budget(body.thinking) if body.thinking is not None else None,
    )


CHOICES: dict[str, Literal["auto", "none", "required"]] = {
    "auto": "auto",
    "none": "none",
    "any": "required",
    "tool": "required",
}


def thinking_budget(thinking: ThinkingConfig) -> int | None:
    """Extended thinking as the internal request's budget: enabled with budget_tokens bounds it, disabled
    closes the block at once; adaptive (and enabled without a budget) leave the server's --reasoning-budget."""
    if thinking.type == "disabled":
        return 0
    if thinking.type == "enabled":
        return thinking.budget_tokens
    return None


def _turn(i: int, m: MessageParam, calls: dict[str, str]) -> list[Turn]:
    """One Messages turn as the internal request's turns: an assistant turn is one (text and calls); a user turn
    is its tool results, each a tool turn, and its text, in the order sent."""
    if isinstance(m.content, str):
        return [Turn(m.role, m.content)]
    texts = [b.text for b in m.content if isinstance(b, TextBlock)]
    if m.role == "system":  # Claude Code's notes in the middle of the conversation, kept where they are
        return [Turn("system", SEPARATOR.join(texts))]
    if m.role == "assistant":
        uses = [b for b in m.content if isinstance(b, ToolUseBlock)]
        calls.update((b.id, b.name) for b in uses)
        return [Turn("assistant", SEPARATOR.join(texts), tuple(PastCall(b.id, b.name, b.input) for b in uses))]
    out: list[Turn] = []
    text: list[str] = []
    for j, b in enumerate(m.content):
        if isinstance(b, ToolResultBlock):
            if b.tool_use_id not in calls:
                raise RequestError(
                    f"messages.{i}.content.{j}: tool_result answers tool_use_id {b.tool_use_id!r}, which no earlier "
                    "assistant tool_use block has; send the assistant turn with that tool_use before its result",
                    f"messages.{i}.content.{j}.tool_use_id",
                )
            if text:
                out.append(Turn("user", SEPARATOR.join(text)))
                text = []
            out.append(Turn("tool", b.text(), call_id=b.tool_use_id, name=calls[b.tool_use_id]))
        elif isinstance(b, TextBlock):
            text.append(b.text)
    if text or not out:
        out.append(Turn("user", SEPARATOR.join(text)))
    return out


# --- the answer, rendered --------------------------------------------------------

STOP_REASONS = {
    "stop": "end_turn",
    "stop_sequence": "stop_sequence",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "cancelled": "end_turn",  # its client left, or the shutdown grace ran out (then an error event follows)
    "error": "end_turn",  # answered with an error instead
}


def tool_use_id(call_id: str) -> str:
    """Anthropic's id for a call: the neutral id's random part behind toolu_."""
    return "toolu_" + call_id.split("_", 1)[-1]


def usage(done: list[Done]) -> dict[str, int]:
    stats = done[0].finish.stats
    return {
        "input_tokens": stats.prompt_tokens - stats.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": stats.cached_tokens,
        "output_tokens": sum(d.finish.stats.completion_tokens for d in done),
    }


def _sse(event: dict[str, Any]) -> dict[str, str]:
    """One SSE item: the event's type is its SSE name too (the SDK reads only named events)."""
    return {"event": event["type"], "data": json.dumps(event)}


class MessagesDialect:
    """The neutral events of one answer as Anthropic's message (whole) or its stream of events.

    Blocks open as their events come: text (or thinking) deltas go into the open block of their kind
    or open a new one; a tool call is a tool_use block of its own, its input sent in input_json_delta
    pieces as the model writes it where the call streams, in one where it comes whole.
    """

    terminal: str | None = None  # no [DONE]: message_stop ends the stream

    def __init__(self, model: str, prompt_tokens: int = 0) -> None:
        self.model = model
        self.prompt_tokens = prompt_tokens  # for message_start; message_delta gives the final figures
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.blocks = 0  # content blocks opened so far
        self.open: str | None = None  # the kind of the open block: "text", "thinking", "tool_use", or None
        self.sent = ""  # the open tool_use block's input sent so far
        self.failed = False  # an error event was sent: it ends the stream, nothing follows it

    def _message(self, content: list[dict[str, Any]], reason: str | None, seq: str | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": seq,
        }

    def start(self, n: int) -> list[dict[str, str]]:
        first = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        first |= {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        return [_sse({"type": "message_start", "message": {**self._message([], None, None), "usage": first}})]

    def _close(self) -> list[dict[str, str]]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # Anthropic ends a thinking block with its signature (none here)
            delta = {"type": "signature_delta", "signature": ""}
            out.append(_sse({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}))
        self.open = None
        return [*out, _sse({"type": "content_block_stop", "index": self.blocks - 1})]

    def _open(self, block: dict[str, Any]) -> list[dict[str, str]]:
        out = self._close()
        out.append(_sse({"type": "content_block_start", "index": self.blocks, "content_block": block}))
        if self.blocks == 0:
            out.append(_sse({"type": "ping"}))
        self.blocks += 1
        return out

    def on(self, ev: Event) -> list[dict[str, str]]:
        if self.failed:
            return []
        if isinstance(ev, TextDelta | ReasoningDelta):
            if not ev.text:
                return []
            kind = "text" if isinstance(ev, TextDelta) else "thinking"
            out = [] if self.open == kind else self._open({"type": "text", "text": ""} if kind == "text" else _THINKING)
            self.open = kind
            delta = {"type": "text_delta", "text": ev.text} if kind == "text" else _thinking_delta(ev.text)
            return [*out, _sse({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})]
        if isinstance(ev, ToolCallDelta):
            out = []
            if ev.name is not None:
                out = self._open({"type": "tool_use", "id": tool_use_id(ev.id), "name": ev.name, "input": {}})
                self.open, self.sent = "tool_use", ""
            elif ev.arguments:
                self.sent += ev.arguments
                out.append(self._input(ev.arguments))
            return out
        if isinstance(ev, ToolCall):
            if self.open == "tool_use":  # it streamed: the rest of its input, if any
                rest = ev.arguments[len(self.sent) :] if ev.arguments.startswith(self.sent) else ""
                out = [self._input(rest)] if rest else []
            else:
                out = self._open({"type": "tool_use", "id": tool_use_id(ev.id), "name": ev.name, "input": {}})
                out.append(self._input(ev.arguments))
            self.open = None
            out.append(_sse({"type": "content_block_stop", "index": self.blocks - 1}))
            return out
        return self._close()  # Done: the last block ends; end() says why

    def _input(self, partial_json: str) -> dict[str, str]:
        delta = {"type": "input_json_delta", "partial_json": partial_json}
        return _sse({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})

    def end(self, done: list[Done]) -> list[dict[str, str]]:
        d = done[0]
        if self.failed:
            return []
        delta = {"stop_reason": STOP_REASONS[d.reason], "stop_sequence": d.stop_sequence}
        return [
            _sse({"type": "message_delta", "delta": delta, "usage": usage(done)}),
            _sse({"type": "message_stop"}),
        ]

    def error_event(self, message: str, code: str) -> dict[str, str]:
        self.failed = True
        return _sse(error_body(503 if code == "shutting_down" else 500, message))

    def response(self, done: list[Done], events: list[Event]) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        for ev in events:
            if isinstance(ev, TextDelta | ReasoningDelta) and ev.text:
                kind, field = ("text", "text") if isinstance(ev, TextDelta) else ("thinking", "thinking")
                if content and content[-1]["type"] == kind:
                    content[-1][field] += ev.text
                else:
                    content.append(
                        {"type": "text", "text": ev.text} if kind == "text" else {**_THINKING, field: ev.text}
                    )
            elif isinstance(ev, ToolCall):
                # A call cut by max_tokens: its input as far as written, as the SDKs' stream accumulators read it.
                args = (
                    json.loads(ev.arguments)
                    if ev.complete
                    else from_json(ev.arguments or "{}", allow_partial="trailing-strings")
                )
                content.append({"type": "tool_use", "id": tool_use_id(ev.id), "name": ev.name, "input": args})
        d = done[0]
        return {**self._message(content, STOP_REASONS[d.reason], d.stop_sequence), "usage": usage(done)}

    def error_response(self, status: int, message: str, code: str) -> JSONResponse:
        return JSONResponse(error_body(status, message), status_code=status)


_THINKING = {"type": "thinking", "thinking": "", "signature": ""}  # no signature: nothing here signs reasoning


def _thinking_delta(text: str) -> dict[str, str]:
    return {"type": "thinking_delta", "thinking": text}


# --- the routes -------------------------------------------------------------------

router = APIRouter(dependencies=[Depends(authorized)])


@router.post("/v1/messages")
async def create_message(request: Request, body: MessagesRequest) -> Any:
    state = server_state(request)
    state.ignored.note("messages", ignored_in(body))
    return await run_chat(request, state, to_input(body), lambda model, n: MessagesDialect(model, n), body.stream)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, body: CountTokensRequest) -> dict[str, int]:
    """The prompt's length in tokens, as /v1/messages would render it: system, messages, tools."""
    state = server_state(request)
    req = to_input(body)
    async with state.lease(req.model) as slot:
        prompt, _, _ = await asyncio.to_thread(prepare, loaded(slot), req)
    return {"input_tokens": len(prompt)}


# Every error answered on /v1/messages and below (a body that fails validation, a wrong key, an
# engine error, an unknown path) is in Anthropic's envelope.
API = Api("messages", router, paths=("/v1/messages",), error_shape=error_body)
