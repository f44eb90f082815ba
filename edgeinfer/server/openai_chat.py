"""OpenAI's chat and text completions: the endpoints, and the neutral events rendered in OpenAI's JSON."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from edgeinfer.events import Finish, StreamStats, TokenLogprob
from edgeinfer.prepare import PLAIN, model_defaults
from edgeinfer.server.api import Api
from edgeinfer.server.lenient import ignored_fields
from edgeinfer.server.output import Done, Event, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta
from edgeinfer.server.run import run_chat
from edgeinfer.server.schema import ChatRequest, CompletionRequest, error_body
from edgeinfer.server.state import authorized, server_state
from edgeinfer.server.streaming import SSEItem, respond, sse_data, submit

router = APIRouter(dependencies=[Depends(authorized)])


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, req: ChatRequest) -> Any:
    state = server_state(request)
    state.ignored.note("chat.completions", ignored_fields(req))
    usage = bool(req.stream_options and req.stream_options.include_usage)
    return await run_chat(
        request, state, req.to_input(), lambda model, _: ChatDialect(model, req.logprobs, usage), req.stream
    )


@router.post("/v1/completions")
async def completions(request: Request, req: CompletionRequest) -> Any:
    state = server_state(request)
    state.ignored.note("completions", ignored_fields(req))
    async with state.lease(req.model) as slot:
        engine = slot.engine
        assert engine is not None  # a leased slot stays loaded
        prompt = req.prompt_input()
        if isinstance(prompt, str) and prompt:
            prompt = await asyncio.to_thread(engine.tokenize, prompt)
        params = model_defaults(req.to_sampling(), req.model_fields_set, engine.facts.sampling_defaults)
        handles = await submit(engine, prompt, params, req.n)
        usage = bool(req.stream_options and req.stream_options.include_usage)
        dialect = CompletionDialect(slot.name, req.logprobs is not None, usage)
        return await respond(request, state, handles, dialect, req.stream, PLAIN)


# Done.reason to OpenAI's finish_reason: a cancelled or failed choice ends as "stop" (the error
# itself is sent as an error object).
FINISH = {
    "stop": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "cancelled": "stop",
    "error": "stop",
}


def usage(finishes: list[Finish], reasoning: int = 0) -> dict[str, Any]:
    """Prompt tokens count once: the n streams of a request share one prompt. reasoning: the completion
    tokens that were thinking (a reasoning model's), as OpenAI counts them."""
    s0 = finishes[0].stats
    completion = sum(f.stats.completion_tokens for f in finishes)
    return {
        "prompt_tokens": s0.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": s0.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": s0.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


def _usage(done: list[Done]) -> dict[str, Any]:
    return usage([d.finish for d in done], sum(getattr(d, "reasoning_tokens", 0) for d in done))


def timings(stats: list[StreamStats]) -> dict[str, Any]:
    """edgeinfer's extra figures: TTFT and decode speed per choice; draft counts named as llama-server names them."""
    return {
        "ttft_s": [s.ttft_s for s in stats],
        "decode_tps": [s.decode_tps for s in stats],
        "cached_tokens": stats[0].cached_tokens,
        "draft_n": sum(s.draft_tokens for s in stats),
        "draft_n_accepted": sum(s.draft_accepted for s in stats),
    }


def _lp_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {
        "token": lp.text,
        "logprob": lp.logprob,
        "bytes": list(lp.text.encode("utf-8")),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode("utf-8"))} for _, t, v in lp.top],
    }


def _legacy_logprobs(lps: list[TokenLogprob]) -> dict[str, Any]:
    return {
        "tokens": [lp.text for lp in lps],
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{t: v for _, t, v in lp.top} for lp in lps],
    }


class _OpenAI:
    """What chat and text completions share: the envelope, the usage chunk, the [DONE] sentinel, errors."""

    prefix = "cmpl"
    chunk_name = ""
    terminal: str | None = "[DONE]"

    def __init__(self, model: str, logprobs: bool, include_usage: bool) -> None:
        self.model = model
        self.logprobs = logprobs
        self.include_usage = include_usage  # stream_options.include_usage: a last chunk with the usage
        self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def end(self, done: list[Done]) -> list[SSEItem]:
        if not self.include_usage:
            return []
        out = self._envelope(self.chunk_name, [])
        out["usage"] = _usage(done)
        out["timings"] = timings([d.finish.stats for d in done])
        return [sse_data(out)]

    def error_event(self, message: str, code: str) -> SSEItem:
        return sse_data(error_body(message, "server_error", code=code))

    def error_response(self, status: int, message: str, code: str) -> JSONResponse:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return JSONResponse(error_body(message, kind, code=code), status_code=status)

    def _whole(self, obj: str, choices: list[dict[str, Any]], done: list[Done]) -> dict[str, Any]:
        out = self._envelope(obj, choices)
        out["usage"] = _usage(done)
        out["timings"] = timings([d.finish.stats for d in done])
        return out


class ChatDialect(_OpenAI):
    """chat.completion and chat.completion.chunk. A tool call that streams goes out as the model writes it (its
    id and name, then its arguments in pieces); one that comes whole goes out with the choice's other whole
    calls in one chunk, before its end."""

    prefix = "chatcmpl"
    chunk_name = "chat.completion.chunk"

    def __init__(self, model: str, logprobs: bool, include_usage: bool = False) -> None:
        super().__init__(model, logprobs, include_usage)
        self.calls: dict[int, list[ToolCall]] = {}  # by choice, until its Done
        self.streamed: dict[tuple[int, int], str] = {}  # (choice, call) -> the arguments sent so far

    def start(self, n: int) -> list[SSEItem]:
        return [sse_data(self._delta(i, {"role": "assistant", "content": ""})) for i in range(n)]

    def on(self, ev: Event) -> list[SSEItem]:
        if isinstance(ev, TextDelta):
            lp = {"content": [_lp_entry(ev.logprob)]} if self.logprobs and ev.logprob else None
            if not ev.text and lp is None:
                return []
            return [sse_data(self._delta(ev.index, {"content": ev.text}, lp=lp))]
        if isinstance(ev, ReasoningDelta):
            return [sse_data(self._delta(ev.index, {"reasoning_content": ev.text}))]
        if isinstance(ev, ToolCallDelta):
            if ev.name is not None:
                self.streamed[ev.index, ev.call_index] = ""
                named = ToolCall(ev.index, ev.call_index, ev.id, ev.name, "")
                fragment: dict[str, Any] = {"index": ev.call_index, **_call(named)}
            else:
                self.streamed[ev.index, ev.call_index] += ev.arguments
                fragment = {"index": ev.call_index, "function": {"arguments": ev.arguments}}
            return [sse_data(self._delta(ev.index, {"tool_calls": [fragment]}))]
        if isinstance(ev, ToolCall):
            sent = self.streamed.pop((ev.index, ev.call_index), None)
            if sent is None:
                self.calls.setdefault(ev.index, []).append(ev)
                return []
            rest = ev.arguments[len(sent) :] if ev.arguments.startswith(sent) else ""
            fragment = {"index": ev.call_index, "function": {"arguments": rest}}
            return [sse_data(self._delta(ev.index, {"tool_calls": [fragment]}))] if rest else []
        out = []
        if calls := self.calls.pop(ev.index, []):
            fragments = [{"index": c.call_index, **_call(c)} for c in calls]
            out.append(sse_data(self._delta(ev.index, {"tool_calls": fragments})))
        return [*out, sse_data(self._delta(ev.index, {}, FINISH[ev.reason]))]

    def _delta(self, index: int, delta: dict[str, Any], reason: str | None = None, lp: Any = None) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name, [{"index": index, "delta": delta, "finish_reason": reason, "logprobs": lp}]
        )

    def response(self, done: list[Done], events: list[Event]) -> dict[str, Any]:
        choices = []
        for d in done:
            mine = [ev for ev in events if ev.index == d.index]
            text = "".join(ev.text for ev in mine if isinstance(ev, TextDelta))
            calls = [_call(ev) for ev in mine if isinstance(ev, ToolCall)]
            message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
            if reasoning := "".join(ev.text for ev in mine if isinstance(ev, ReasoningDelta)):
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = calls
            lps = d.finish.logprobs or []
            choices.append(
                {
                    "index": d.index,
                    "message": message,
                    "finish_reason": FINISH[d.reason],
                    "logprobs": {"content": [_lp_entry(lp) for lp in lps]} if self.logprobs else None,
                }
            )
        return self._whole("chat.completion", choices, done)


def _call(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


class CompletionDialect(_OpenAI):
    """text_completion, streamed or whole; no tools, no role chunk."""

    prefix = "cmpl"
    chunk_name = "text_completion"

    def start(self, n: int) -> list[SSEItem]:
        return []

    def on(self, ev: Event) -> list[SSEItem]:
        if isinstance(ev, TextDelta):
            lp = _legacy_logprobs([ev.logprob]) if self.logprobs and ev.logprob else None
            choice = {"index": ev.index, "text": ev.text, "finish_reason": None, "logprobs": lp}
            return [sse_data(self._envelope(self.chunk_name, [choice]))]
        if isinstance(ev, Done):
            choice = {"index": ev.index, "text": "", "finish_reason": FINISH[ev.reason], "logprobs": None}
            return [sse_data(self._envelope(self.chunk_name, [choice]))]
        return []

    def response(self, done: list[Done], events: list[Event]) -> dict[str, Any]:
        choices = [
            {
                "index": d.index,
                "text": "".join(ev.text for ev in events if isinstance(ev, TextDelta) and ev.index == d.index),
                "finish_reason": FINISH[d.reason],
                "logprobs": _legacy_logprobs(d.finish.logprobs or []) if self.logprobs else None,
            }
            for d in done
        ]
        return self._whole("text_completion", choices, done)


API = Api("chat", router)  # OpenAI's chat and text completions; errors in OpenAI's shape
