"""Emitter: on the engine thread, each stream's new tokens become its caller's events.

The Emitter turns a stream's tokens into text (stop strings, UTF-8), Chunk and Finish events
and its figures, and says where the stream ends; events for asyncio handles are gathered in
an Outbox and handed to each loop once per step, not once per token, so a busy step costs
the event loop one wake-up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from edgeinfer.engine.handle import Event, StreamHandle
from edgeinfer.engine.metrics import Metrics
from edgeinfer.engine.step import StepOutput
from edgeinfer.engine.stream import Status, Stream
from edgeinfer.events import Chunk, Finish, StreamStats, TokenLogprob
from edgeinfer.llamacpp import Vocab


class Emitter:
    """Emits streams' tokens as their callers' Chunk and Finish events, and says where a stream ends; engine
    thread, under its lock."""

    def __init__(self, vocab: Vocab, metrics: Metrics) -> None:
        self.vocab = vocab
        self.metrics = metrics
        self.outbox = Outbox()

    def tokens(
        self,
        s: Stream,
        tokens: list[int],
        now: float,
        n_rejected: int = 0,
        lp: TokenLogprob | None = None,
        in_kv: bool = True,
    ) -> StepOutput:
        """Hand a stream its new tokens, up to the one it ends on if it does.

        in_kv: the tokens before the last are in the KV already (accepted drafts), rather than
        forced by a grammar and still to be computed."""
        for j, token in enumerate(tokens):
            status = self._emit(s, token, s.n_generated + j + 1, now, lp if j == 0 else None)
            if status is not None:
                # Ended early: accepted positions after this token leave the KV too.
                dropped = len(tokens) - 1 - j if in_kv else 0
                return StepOutput(s, tokens[: j + 1], n_rejected + dropped, status)
        return StepOutput(s, tokens, n_rejected)

    def _emit(self, s: Stream, token: int, n_generated: int, now: float, lp: TokenLogprob | None) -> Status | None:
        """Send one token's text to the caller; return the status the stream ends with, if it does."""
        if s.t_first == 0.0:
            s.t_first = now
            self.metrics.ttft(now - s.t_submit)
        else:
            self.metrics.itl(now - s.t_last)
        s.t_last = now
        index, t = s.index, now - s.t_submit
        if self.vocab.is_eog(token) and (
            s.grammar is not None or not s.params.ignore_eos
        ):  # a grammar's end is the end; one the budget steered it to says so
            return Status.LENGTH if s.grammar is not None and s.grammar.steered else Status.STOPPED
        delta = s.text.feed(self.vocab.piece(token))
        if s.text.stopped:
            if delta:
                self.outbox.push(s.handle, Chunk(index, delta, [token], t))
            return Status.STOPPED
        self.outbox.push(s.handle, Chunk(index, delta, [token], t, lp))
        return Status.LENGTH if n_generated >= s.max_new else None

    def finish(self, s: Stream, error: str | None = None) -> None:
        """The stream has ended (the scheduler knows): flush its text and send its Finish."""
        rest = s.text.flush()
        now = time.perf_counter()
        if rest:
            self.outbox.push(s.handle, Chunk(s.index, rest, [], now - s.t_submit))
        n_gen = s.n_generated
        decode_s = s.t_last - s.t_first
        stats = StreamStats(
            prompt_tokens=s.n_prompt,
            cached_tokens=s.n_cached,
            completion_tokens=n_gen,
            ttft_s=(s.t_first - s.t_submit) if s.t_first else None,
            decode_tps=(n_gen - 1) / decode_s if n_gen > 1 and decode_s > 0 else None,
            total_s=now - s.t_submit,
            draft_tokens=s.n_drafted,
            draft_accepted=s.n_accepted,
        )
        self.metrics.prompt_tokens += s.n_prompt
        if s.grammar is not None:
            self.metrics.constrained_tokens += n_gen
            self.metrics.forced_tokens += s.grammar.forced
        s.sampler.close()
        reason = s.status.reason
        self.metrics.finish(reason)
        gen = s.tokens[s.n_prompt :]
        finish = Finish(s.index, reason, s.text.text, gen, stats, s.logprobs or None, error or s.error)
        if reason == "stop":
            finish.stop_sequence = s.text.stop_hit
        self.outbox.push(s.handle, finish)


class Outbox:
    """Events from the engine thread to their handles: sync handles at once, asyncio ones once per flush."""

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Any, Event]]] = {}  # engine thread only

    def push(self, handle: StreamHandle, event: Event) -> None:
        if handle.loop is None:
            handle.queue.put(event)
        else:
            self._pending.setdefault(handle.loop, []).append((handle.queue, event))

    def __bool__(self) -> bool:
        """Whether events are held for a flush."""
        return bool(self._pending)

    def flush(self) -> list[asyncio.AbstractEventLoop]:
        """Hand the step's events to each loop in one call; returns the loops that are gone (nobody listens)."""
        pending, self._pending = self._pending, {}
        gone = []
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                gone.append(loop)
        return gone


def _deliver(items: list[tuple[asyncio.Queue[Any], Event]]) -> None:
    for q, event in items:
        q.put_nowait(event)
