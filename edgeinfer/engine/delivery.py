"""Streams and their callers: StreamHandle (what a caller reads) and Delivery (how tokens become its events).

A handle is read synchronously (iterate it, result(), collect()) or from an asyncio
loop (`async for`, aresult()). On the engine thread, Delivery turns each stream's new
tokens into text (stop strings, UTF-8), Chunk and Finish events and its figures; events
for asyncio handles are gathered in an Outbox and handed to each loop once per step, not
once per token, so a busy step costs the event loop one wake-up.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.engine.grammar import Guide
from edgeinfer.engine.metrics import Metrics
from edgeinfer.engine.step import Status, StepOutput, Stream
from edgeinfer.engine.text import TextStream
from edgeinfer.events import Chunk, Finish, StreamStats, TokenLogprob
from edgeinfer.llamacpp import Sampler, Vocab
from edgeinfer.options import SamplingParams

Event = Chunk | Finish
FINISH_REASONS = {Status.STOPPED: "stop", Status.LENGTH: "length", Status.CANCELLED: "cancelled", Status.ERROR: "error"}


class StreamHandle:
    """One stream of a request: iterate it (sync or async) for Chunk events, then one Finish."""

    def __init__(
        self, stream_id: int, index: int, cancel: Callable[[StreamHandle], None], loop: asyncio.AbstractEventLoop | None
    ) -> None:
        self.id = stream_id
        self.index = index  # which of the request's n streams
        self.loop = loop
        self.finish: Finish | None = None
        self._cancel = cancel
        self._q: Any = asyncio.Queue() if loop is not None else _SyncQueue()

    def cancel(self) -> None:
        """Stop this stream; its KV is freed at the next step."""
        self._cancel(self)

    def __iter__(self) -> Iterator[Event]:
        while self.finish is None:
            event = self._q.get()
            if isinstance(event, Finish):
                self.finish = event
            yield event

    async def __aiter__(self) -> AsyncIterator[Event]:
        while self.finish is None:
            event = await self._q.get()
            if isinstance(event, Finish):
                self.finish = event
            yield event

    def result(self) -> Finish:
        """Wait for the end of the stream (sync handles); chunks not yet read are dropped."""
        if self.finish is None:
            self.finish = self._q.last()
        assert self.finish is not None
        return self.finish

    def collect(self) -> list[Event]:
        """Wait for the end of the stream (sync handles); every event in order, without a wake-up per token."""
        events = self._q.all()
        self.finish = events[-1]
        return events

    async def aresult(self) -> Finish:
        async for _ in self:
            pass
        assert self.finish is not None
        return self.finish


@dataclass(slots=True)
class Live:
    """Engine-side state of one stream, from submit to its Finish event."""

    stream: Stream
    handle: StreamHandle
    params: SamplingParams
    sampler: Sampler
    text: TextStream
    t_submit: float
    t_first: float = 0.0
    t_last: float = 0.0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    guide: Guide | None = None  # the stream's grammar, if its request has one
    error: str | None = None  # why the stream ended with an error, when the step found out


class Delivery:
    """Every live stream's caller-side state, and the delivery of its tokens; engine thread, under its lock."""

    def __init__(self, vocab: Vocab, metrics: Metrics) -> None:
        self.vocab = vocab
        self.metrics = metrics
        self.live: dict[int, Live] = {}  # by stream id
        self.outbox = Outbox()

    def open(self, live: Live) -> None:
        self.live[live.stream.id] = live

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
        live = self.live[s.id]
        for j, token in enumerate(tokens):
            status = self._emit(live, token, s.n_generated + j + 1, now, lp if j == 0 else None)
            if status is not None:
                # Ended early: accepted positions after this token leave the KV too.
                dropped = len(tokens) - 1 - j if in_kv else 0
                return StepOutput(s, tokens[: j + 1], n_rejected + dropped, status)
        return StepOutput(s, tokens, n_rejected)

    def _emit(self, live: Live, token: int, n_generated: int, now: float, lp: TokenLogprob | None) -> Status | None:
        """Send one token's text to the caller; return the status the stream ends with, if it does."""
        if live.t_first == 0.0:
            live.t_first = now
            self.metrics.ttft(now - live.t_submit)
        else:
            self.metrics.itl(now - live.t_last)
        live.t_last = now
        index, t = live.stream.index, now - live.t_submit
        if self.vocab.is_eog(token) and (
            live.guide is not None or not live.params.ignore_eos
        ):  # a grammar's end is the end; one the budget steered it to says so
            return Status.LENGTH if live.guide is not None and live.guide.steered else Status.STOPPED
        delta = live.text.feed(self.vocab.piece(token))
        if live.text.stopped:
            if delta:
                self.outbox.push(live.handle, Chunk(index, delta, [token], t))
            return Status.STOPPED
        self.outbox.push(live.handle, Chunk(index, delta, [token], t, lp))
        return Status.LENGTH if n_generated >= live.stream.max_new else None

    def finish(self, s: Stream, drafted: int = 0, accepted: int = 0, error: str | None = None) -> None:
        """The stream has ended (the scheduler knows): flush its text and send its Finish."""
        live = self.live.pop(s.id)
        rest = live.text.flush()
        now = time.perf_counter()
        if rest:
            self.outbox.push(live.handle, Chunk(s.index, rest, [], now - live.t_submit))
        n_gen = s.n_generated
        decode_s = live.t_last - live.t_first
        stats = StreamStats(
            prompt_tokens=s.n_prompt,
            cached_tokens=s.n_cached,
            completion_tokens=n_gen,
            ttft_s=(live.t_first - live.t_submit) if live.t_first else None,
            decode_tps=(n_gen - 1) / decode_s if n_gen > 1 and decode_s > 0 else None,
            total_s=now - live.t_submit,
            draft_tokens=drafted,
            draft_accepted=accepted,
        )
        self.metrics.prompt_tokens += s.n_prompt
        if live.guide is not None:
            self.metrics.constrained_tokens += n_gen
            self.metrics.forced_tokens += live.guide.forced
        live.sampler.close()
        reason = FINISH_REASONS[s.status]
        self.metrics.finish(reason)
        gen = s.tokens[s.n_prompt :]
        finish = Finish(s.index, reason, live.text.text, gen, stats, live.logprobs or None, error or live.error)
        if reason == "stop":
            finish.stop_sequence = live.text.stop_hit
        self.outbox.push(live.handle, finish)


class Outbox:
    """Events from the engine thread to their handles: sync handles at once, asyncio ones once per flush."""

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Any, Event]]] = {}  # engine thread only

    def push(self, handle: StreamHandle, event: Event) -> None:
        if handle.loop is None:
            handle._q.put(event)
        else:
            self._pending.setdefault(handle.loop, []).append((handle._q, event))

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


class _SyncQueue:
    """A blocking queue whose reader can also wait for the last item alone (no wake-up per token)."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._cv = threading.Condition()
        self._waiting = False
        self._want_last = False
        self._closed = False

    def put(self, item: Any) -> None:
        with self._cv:
            self._items.append(item)
            if isinstance(item, Finish):
                self._closed = True
            if self._waiting and (self._closed or not self._want_last):
                self._cv.notify()

    def get(self) -> Any:
        with self._cv:
            while not self._items:
                self._waiting = True
                self._cv.wait()
                self._waiting = False
            return self._items.popleft()

    def last(self) -> Any:
        """Wait for the final item and return it, dropping the ones before it."""
        return self.all()[-1]

    def all(self) -> list[Any]:
        """Wait for the final item and return every item not yet read."""
        with self._cv:
            self._want_last = True
            while not self._closed:
                self._waiting = True
                self._cv.wait()
                self._waiting = False
            items = list(self._items)
            self._items.clear()
            return items
