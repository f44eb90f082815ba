"""Engine events to OpenAI's JSON shapes, for chat and text completions."""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from edgeinfer.events import Chunk, Finish, StreamStats, TokenLogprob
from edgeinfer.server.output import TextDelta, ToolCall, whole
from edgeinfer.server.tools import CallWatch

FINISH = {"stop": "stop", "length": "length", "cancelled": "stop", "error": "stop"}


def usage(finishes: list[Finish]) -> dict[str, Any]:
    """Prompt tokens count once: the n streams of a request share one prompt."""
    s0 = finishes[0].stats
    completion = sum(f.stats.completion_tokens for f in finishes)
    return {
        "prompt_tokens": s0.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": s0.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": s0.cached_tokens},
    }


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


class Format(Protocol):
    sends_role: bool

    def first_chunk(self, index: int) -> dict[str, Any]: ...
    def chunk(self, ev: Chunk) -> dict[str, Any] | None: ...
    def final_chunks(self, f: Finish) -> list[dict[str, Any]]: ...
    def usage_chunk(self, finishes: list[Finish]) -> dict[str, Any]: ...
    def response(self, finishes: list[Finish]) -> dict[str, Any]: ...


class _Base:
    object_name = ""
    chunk_name = ""
    sends_role = False

    def __init__(self, model: str, logprobs: bool) -> None:
        self.model = model
        self.logprobs = logprobs
        self.id = f"{self.prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    prefix = "cmpl"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def usage_chunk(self, finishes: list[Finish]) -> dict[str, Any]:
        out = self._envelope(self.chunk_name, [])
        out["usage"] = usage(finishes)
        out["timings"] = timings([f.stats for f in sorted(finishes, key=lambda f: f.index)])
        return out


class ChatFormat(_Base):
    prefix = "chatcmpl"
    chunk_name = "chat.completion.chunk"
    sends_role = True

    def __init__(self, model: str, logprobs: bool, tools: bool = False) -> None:
        super().__init__(model, logprobs)
        self.tools = tools  # answers may hold tool calls: parse them, and hold back what may open one
        self.watch: dict[int, CallWatch] = {}

    def _calls(self, f: Finish) -> tuple[str | None, list[dict[str, Any]]]:
        """The choice's text before any call, and its complete calls (a call cut by max_tokens is left out)."""
        events = whole(f, self.tools)
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in events
            if isinstance(c, ToolCall)
        ]
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        return (text if text or not calls else None), calls

    @staticmethod
    def _reason(f: Finish, calls: list[dict[str, Any]]) -> str:
        return "tool_calls" if calls and f.finish_reason == "stop" else FINISH[f.finish_reason]

    def first_chunk(self, index: int) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name,
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "logprobs": None}],
        )

    def chunk(self, ev: Chunk) -> dict[str, Any] | None:
        lp = {"content": [_lp_entry(ev.logprob)]} if self.logprobs and ev.logprob else None
        text = self.watch.setdefault(ev.index, CallWatch()).feed(ev.text) if self.tools else ev.text
        if not text and lp is None:
            return None
        return self._delta(ev.index, {"content": text}, lp=lp)

    def _delta(self, index: int, delta: dict[str, Any], reason: str | None = None, lp: Any = None) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name, [{"index": index, "delta": delta, "finish_reason": reason, "logprobs": lp}]
        )

    def final_chunks(self, f: Finish) -> list[dict[str, Any]]:
        """The end of one choice: its tool calls, or the text held back in case it opened one; then the reason."""
        out = []
        _, calls = self._calls(f)
        if calls:
            fragments = [{"index": i, **c} for i, c in enumerate(calls)]
            out.append(self._delta(f.index, {"tool_calls": fragments}))
        elif self.tools and (rest := self.watch.setdefault(f.index, CallWatch()).rest()):
            out.append(self._delta(f.index, {"content": rest}))
        return [*out, self._delta(f.index, {}, self._reason(f, calls))]

    def response(self, finishes: list[Finish]) -> dict[str, Any]:
        finishes = sorted(finishes, key=lambda f: f.index)
        choices = []
        for f in finishes:
            content, calls = self._calls(f)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choices.append(
                {
                    "index": f.index,
                    "message": message,
                    "finish_reason": self._reason(f, calls),
                    "logprobs": {"content": [_lp_entry(lp) for lp in f.logprobs or []]} if self.logprobs else None,
                }
            )
        out = self._envelope("chat.completion", choices)
        out["usage"] = usage(finishes)
        out["timings"] = timings([f.stats for f in finishes])
        return out


class CompletionFormat(_Base):
    prefix = "cmpl"
    chunk_name = "text_completion"

    def first_chunk(self, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def chunk(self, ev: Chunk) -> dict[str, Any]:
        lp = _legacy_logprobs([ev.logprob]) if self.logprobs and ev.logprob else None
        return self._envelope(
            self.chunk_name, [{"index": ev.index, "text": ev.text, "finish_reason": None, "logprobs": lp}]
        )

    def final_chunks(self, f: Finish) -> list[dict[str, Any]]:
        return [
            self._envelope(
                self.chunk_name,
                [{"index": f.index, "text": "", "finish_reason": FINISH[f.finish_reason], "logprobs": None}],
            )
        ]

    def response(self, finishes: list[Finish]) -> dict[str, Any]:
        finishes = sorted(finishes, key=lambda f: f.index)
        choices = [
            {
                "index": f.index,
                "text": f.text,
                "finish_reason": FINISH[f.finish_reason],
                "logprobs": _legacy_logprobs(f.logprobs or []) if self.logprobs else None,
            }
            for f in finishes
        ]
        out = self._envelope("text_completion", choices)
        out["usage"] = usage(finishes)
        out["timings"] = timings([f.stats for f in finishes])
        return out
