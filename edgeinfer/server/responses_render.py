"""The neutral event stream as OpenAI's Responses: one Response object, or the typed SSE sequence.

Streamed, a response is `response.created`, `response.in_progress`, then per output item
`response.output_item.added` ... `response.output_item.done` (a reasoning model's thinking first, as a
`reasoning` item whose `reasoning_text` part streams as `response.reasoning_text.delta` events; a
message's text part between `response.content_part.added` and `.done`, its text as
`response.output_text.delta` events; a function call's arguments as one
`response.function_call_arguments.delta` and `.done`), and last `response.completed`,
`response.incomplete` (max_output_tokens) or `response.failed`.
Every event carries `type` (also the SSE event name) and `sequence_number`; no [DONE] follows.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse

from edgeinfer.server.output import Done, Event, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta
from edgeinfer.server.schema import error_body

# The neutral end of a choice to the response's status.
STATUS = {
    "stop": "completed",
    "stop_sequence": "completed",
    "tool_calls": "completed",
    "length": "incomplete",
    "cancelled": "failed",
    "error": "failed",
}
TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(done: Done) -> dict[str, Any]:
    """Input tokens include the cached ones, as OpenAI counts them; cached come from the prefix cache.
    Cache writes are not counted (0): every finished stream's KV may be kept, and nothing is billed."""
    s = done.finish.stats
    return {
        "input_tokens": s.prompt_tokens,
        "input_tokens_details": {"cached_tokens": s.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": s.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": getattr(done, "reasoning_tokens", 0)},
        "total_tokens": s.prompt_tokens + s.completion_tokens,
    }


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """An assistant message; text None while streaming, before its part is added."""
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """A reasoning model's thinking, as its text (OpenAI's open-weight models' shape: no summary, nothing
    encrypted); text None while streaming, before its part is added."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def call_item(
    item_id: str,
    call: ToolCall,
    arguments: str,
    status: str,
    origin: dict[str, tuple[str | None, str]] | None = None,
) -> dict[str, Any]:
    """A function call item, named as the client named the function (a namespace's, with its namespace)."""
    namespace, name = (origin or {}).get(call.name, (None, call.name))
    item = {"id": item_id, "type": "function_call", "status": status, "call_id": call.id, "name": name}
    if namespace is not None:
        item["namespace"] = namespace
    return {**item, "arguments": arguments}


class ResponsesDialect:
    """One response: renders its single choice's events (Responses has no `n`). `echo` holds the request
    fields the Response object repeats (tools, tool_choice, text, instructions, ...); `keep` is called
    with the finished response object (the store keeps it when the request asked to be stored)."""

    terminal: str | None = None  # the stream ends with its terminal event, no sentinel

    def __init__(
        self,
        model: str,
        echo: dict[str, Any],
        keep: Callable[[dict[str, Any]], object] | None = None,
        origin: dict[str, tuple[str | None, str]] | None = None,
    ) -> None:
        self.origin = origin or {}  # the model's tool names -> (namespace, the client's name)
        self.id = new_id("resp")
        self.model = model
        self.echo = echo
        self.keep = keep
        self.created_at = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # finished items
        self.open: dict[str, Any] | None = None  # the message or reasoning item being streamed
        self.text = ""  # its text so far
        self.calling: tuple[str, int, str] | None = None  # a streaming call: (item id, output index, arguments sent)
        self.calling_name: dict[str, str] = {}  # its call_id, name (and namespace) as its item says them

    # --- the Response object ---------------------------------------------------------

    def snapshot(self, status: str, done: Done | None = None) -> dict[str, Any]:
        reason = done.reason if done is not None else None
        incomplete = {"reason": "max_output_tokens"} if reason == "length" else None
        error = None
        if reason in ("error", "cancelled"):
            assert done is not None
            message = done.finish.error or "the response was cancelled before it finished"
            error = {"code": "server_error", "message": message}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": list(self.output),
            "usage": usage(done) if done is not None else None,
            **self.echo,
        }

    def _finished(self, done: Done) -> dict[str, Any]:
        response = self.snapshot(STATUS.get(done.reason, "failed"), done)
        if self.keep is not None:
            self.keep(response)
        return response

    def response(self, done: list[Done], events: list[Event]) -> dict[str, Any]:
        """The whole answer at once: its thinking as a reasoning item, its text as one message, then its calls."""
        text = "".join(ev.text for ev in events if isinstance(ev, TextDelta))
        calls = [ev for ev in events if isinstance(ev, ToolCall)]
        status = "completed" if STATUS.get(done[0].reason) == "completed" else "incomplete"
        if thought := "".join(ev.text for ev in events if isinstance(ev, ReasoningDelta)):
            # Cut by max_output_tokens before the answer began, the thinking is what is incomplete.
            self.output.append(reasoning_item(new_id("rs"), thought, status if not text and not calls else "completed"))
        if text or not calls:
            self.output.append(message_item(new_id("msg"), text, status))
        for call in calls:
            state = "completed" if call.complete else "incomplete"  # cut by max_output_tokens: as written
            self.output.append(call_item(new_id("fc"), call, call.arguments, state, self.origin))
        return self._finished(done[0])

    # --- streaming ------------------------------------------------------------------

    def _sse(self, type_: str, **fields: Any) -> dict[str, str]:
        event = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return {"event": type_, "data": json.dumps(event)}

    def start(self, n: int) -> list[dict[str, str]]:
        first = self.snapshot("in_progress")
        return [self._sse("response.created", response=first), self._sse("response.in_progress", response=first)]

    def on(self, ev: Event) -> list[dict[str, str]]:
        if isinstance(ev, ReasoningDelta):
            if not ev.text:
                return []
            out = self._open_item("reasoning")
            self.text += ev.text
            return [*out, self._sse("response.reasoning_text.delta", **self._where(), delta=ev.text)]
        if isinstance(ev, TextDelta):
            if not ev.text:
                return []  # a logprob alone, or text held back
            out = self._open_item("message")
            self.text += ev.text
            where = self._where()
            return [*out, self._sse("response.output_text.delta", **where, delta=ev.text, logprobs=[])]
        if isinstance(ev, ToolCallDelta):
            if ev.name is not None:
                out = self._close_item("completed")
                item_id, index = new_id("fc"), len(self.output)
                self.calling = (item_id, index, "")
                named = ToolCall(ev.index, ev.call_index, ev.id, ev.name, "")
                added = call_item(item_id, named, "", "in_progress", self.origin)
                self.calling_name = {k: v for k, v in added.items() if k in ("call_id", "name", "namespace")}
                return [*out, self._sse("response.output_item.added", output_index=index, item=added)]
            assert self.calling is not None
            item_id, index, sent = self.calling
            self.calling = (item_id, index, sent + ev.arguments)
            where = {"item_id": item_id, "output_index": index}
            return [self._sse("response.function_call_arguments.delta", **where, delta=ev.arguments)]
        if isinstance(ev, ToolCall):
            out = self._close_item("completed")
            return [*out, *self._call(ev)]
        if isinstance(ev, Done):
            status = "completed" if STATUS.get(ev.reason) == "completed" else "incomplete"
            if self.calling is not None:  # a call cut before it closed: its item ends incomplete, as written
                return [*self._cut_call(), *self._close_item(status)]
            thinking = self.open is not None and self.open["type"] == "reasoning"
            out = self._close_item("completed" if thinking and status == "completed" else status)
            # An answer with neither text nor calls is still one (empty) message.
            if not any(item["type"] in ("message", "function_call") for item in self.output):
                out += [*self._open_item("message"), *self._close_item(status)]
            return out
        return []

    def end(self, done: list[Done]) -> list[dict[str, str]]:
        response = self._finished(done[0])
        return [self._sse(TERMINAL[response["status"]], response=response)]

    def error_event(self, message: str, code: str) -> dict[str, str]:
        return self._sse("error", code=code, message=message, param=None)

    def error_response(self, status: int, message: str, code: str) -> JSONResponse:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return JSONResponse(error_body(message, kind, None, code), status_code=status)

    def _where(self) -> dict[str, Any]:
        assert self.open is not None
        return {"item_id": self.open["id"], "output_index": len(self.output), "content_index": 0}

    def _open_item(self, kind: str) -> list[dict[str, str]]:
        """Open a message or reasoning item (closing the other kind first); nothing when one of kind is open."""
        if self.open is not None and self.open["type"] == kind:
            return []
        out = self._close_item("completed")
        if kind == "reasoning":
            self.open = reasoning_item(new_id("rs"), None, "in_progress")
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            self.open = message_item(new_id("msg"), None, "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.text = ""
        return [
            *out,
            self._sse("response.output_item.added", output_index=len(self.output), item=self.open),
            self._sse("response.content_part.added", **self._where(), part=part),
        ]

    def _close_item(self, status: str) -> list[dict[str, str]]:
        if self.open is None:
            return []
        where = self._where()
        if self.open["type"] == "reasoning":
            item = reasoning_item(self.open["id"], self.text, status)
            done = self._sse("response.reasoning_text.done", **where, text=self.text)
        else:
            item = message_item(self.open["id"], self.text, status)
            done = self._sse("response.output_text.done", **where, text=self.text, logprobs=[])
        out = [
            done,
            self._sse("response.content_part.done", **where, part=item["content"][0]),
            self._sse("response.output_item.done", output_index=where["output_index"], item=item),
        ]
        self.output.append(item)
        self.open = None
        return out

    def _cut_call(self) -> list[dict[str, str]]:
        assert self.calling is not None
        (item_id, index, sent), self.calling = self.calling, None
        name = self.calling_name
        where = {"item_id": item_id, "output_index": index}
        item = {"id": item_id, "type": "function_call", "status": "incomplete", **name, "arguments": sent}
        self.output.append(item)
        return [
            self._sse("response.function_call_arguments.done", **where, name=item["name"], arguments=sent),
            self._sse("response.output_item.done", output_index=index, item=item),
        ]

    def _call(self, call: ToolCall) -> list[dict[str, str]]:
        """A call's last events: its item added and its arguments in one delta when it came whole; the rest of
        its arguments when it streamed."""
        out = []
        if self.calling is not None:
            (item_id, index, sent), self.calling = self.calling, None
            rest = call.arguments[len(sent) :] if call.arguments.startswith(sent) else ""
        else:
            item_id, index, rest = new_id("fc"), len(self.output), call.arguments
            added = call_item(item_id, call, "", "in_progress", self.origin)
            out.append(self._sse("response.output_item.added", output_index=index, item=added))
        where = {"item_id": item_id, "output_index": index}
        item = call_item(item_id, call, call.arguments, "completed", self.origin)
        if rest:
            out.append(self._sse("response.function_call_arguments.delta", **where, delta=rest))
        out += [
            self._sse("response.function_call_arguments.done", **where, name=item["name"], arguments=call.arguments),
            self._sse("response.output_item.done", output_index=index, item=item),
        ]
        self.output.append(item)
        return out
