"""Answering a submitted request in any API: streamed or whole, through the shutdown grace and client disconnects.

What is API-specific (event names, framing, the terminal sentinel, error shapes, the
whole answer's JSON) a Dialect says; this module only runs the streams. The streams' engine
events become neutral events (edgeinfer.server.output) that the dialect renders.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from edgeinfer.engine import Engine, StreamHandle
from edgeinfer.events import Chunk, Finish
from edgeinfer.options import SamplingParams
from edgeinfer.prepare import AnswerShape
from edgeinfer.server.output import ChoiceOutput, Done, Event, whole
from edgeinfer.server.sse import EventStream, SSEItem, encode
from edgeinfer.server.state import ServerState

POLL_S = 0.2  # how often a waiting request looks for its client leaving or the grace running out
CUT_MARGIN_S = 5.0  # after the grace, time for cancelled streams to send their end before the hard cut


class Dialect(Protocol):
    """One API's rendering of the neutral events: made per request, so it may keep state (ids, counters)."""

    terminal: str | None  # data of the last SSE item ("[DONE]" for OpenAI's chat and text completions), or none

    def start(self, n: int) -> list[SSEItem]:
        """SSE items sent first, for n choices (chat: a role chunk per choice; Messages: message_start)."""
        ...

    def on(self, ev: Event) -> list[SSEItem]:
        """SSE items for one neutral event (often none: a dialect may hold events until a Done)."""
        ...

    def end(self, done: list[Done]) -> list[SSEItem]:
        """After every choice is Done, before the terminal (a usage chunk, message_stop, response.completed)."""
        ...

    def error_event(self, message: str, code: str) -> SSEItem:
        """An SSE item in the API's error shape, sent before the failed choice's Done."""
        ...

    def response(self, done: list[Done], events: list[Event]) -> dict[str, Any]:
        """The whole answer (not streamed): every choice's events in order, and the Done of each, by index."""
        ...

    def error_response(self, status: int, message: str, code: str) -> JSONResponse:
        """An error answer in the API's shape, for a failure after submission (500, or 503 shutting_down)."""
        ...


async def submit(engine: Engine, prompt: str | list[int], params: SamplingParams, n: int) -> list[StreamHandle]:
    """engine.submit in a worker thread (it checks the prompt and builds a sampler per stream,
    under the engine's lock); should this request be cancelled meanwhile, its streams are too."""
    work = asyncio.ensure_future(asyncio.to_thread(engine.submit, prompt, params, n, asyncio.get_running_loop()))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        work.add_done_callback(_cancel_submitted)
        raise


def _cancel_submitted(work: asyncio.Future[list[StreamHandle]]) -> None:
    if not work.cancelled() and work.exception() is None:
        for h in work.result():
            h.cancel()


async def respond(
    request: Request,
    state: ServerState,
    handles: list[StreamHandle],
    dialect: Dialect,
    stream: bool,
    shape: AnswerShape,
) -> Any:
    """The answer to a submitted request: an SSE stream, or the whole answer once every choice ends.

    shape: how to read the text (the format of its tool calls, when the request offered tools)."""
    if stream:
        # _sse ends the stream cleanly when the grace runs out; uvicorn's graceful timeout,
        # CUT_MARGIN_S later, is the backstop should the engine not answer (listen.serve).
        return EventStream(_sse(handles, dialect, shape, state))
    results = asyncio.ensure_future(asyncio.gather(*(_collect(h) for h in handles)))
    try:
        while not results.done():
            await asyncio.wait({results}, timeout=POLL_S)
            if results.done():
                break
            if await request.is_disconnected():
                # Its client is gone (a timeout, and the SDK retries): stop generating for nobody.
                _cancel(handles, results)
                return Response(status_code=499)
            left = state.grace_left()
            if left is not None and left <= 0:
                _cancel(handles, results)
                return dialect.error_response(503, shutting_down("request", state.grace_s), "shutting_down")
        answers = sorted(results.result(), key=lambda a: a[1].index)
    except asyncio.CancelledError:
        _cancel(handles, results)
        raise
    failed = next((f for _, f in answers if f.finish_reason == "error"), None)
    if failed is not None:
        return dialect.error_response(500, failed.error or "generation failed", "server_error")
    events = [ev for chunks, finish in answers for ev in whole(chunks, finish, shape)]
    return dialect.response([ev for ev in events if isinstance(ev, Done)], events)


async def _collect(handle: StreamHandle) -> tuple[list[Chunk], Finish]:
    """One stream's Chunks, once it has ended, and its Finish."""
    chunks = [ev async for events in handle.batches() for ev in events if isinstance(ev, Chunk)]
    assert handle.finish is not None
    return chunks, handle.finish


def shutting_down(what: str, grace_s: float) -> str:
    return f"the server is shutting down; this {what} did not finish within --grace {grace_s:g} s"


def _cancel(handles: list[StreamHandle], results: asyncio.Future[Any]) -> None:
    for h in handles:
        h.cancel()
    results.cancel()


async def _events(handles: list[StreamHandle]) -> AsyncIterator[list[Chunk | Finish]]:
    """The events of n streams in the groups they come in, ending after the last Finish."""
    if len(handles) == 1:
        async for events in handles[0].batches():
            yield events
        return
    queue: asyncio.Queue[list[Chunk | Finish]] = asyncio.Queue()

    async def pump(h: StreamHandle) -> None:
        async for events in h.batches():
            queue.put_nowait(events)

    tasks = [asyncio.create_task(pump(h)) for h in handles]
    try:
        left = len(handles)
        while left:
            events = await queue.get()
            left -= isinstance(events[-1], Finish)
            yield events
    finally:
        for t in tasks:
            t.cancel()


async def _cut_at_grace(handles: list[StreamHandle], state: ServerState, cut: list[bool]) -> None:
    """Once shutting down, cancel the streams when the grace runs out, so that _sse still sends
    their end and an error before uvicorn's graceful timeout cuts the connection."""
    while True:
        left = state.grace_left()
        if left is not None and left <= 0:
            cut.append(True)
            for h in handles:
                h.cancel()
            return
        await asyncio.sleep(POLL_S if left is None else min(POLL_S, left))


async def _sse(
    handles: list[StreamHandle], dialect: Dialect, shape: AnswerShape, state: ServerState
) -> AsyncGenerator[bytes, None]:
    """Merge the n streams' events into one SSE stream, a chunk for each group of events that came together
    (one write to the socket, not one a token); a disconnect cancels every stream."""
    outputs = [ChoiceOutput(shape) for _ in handles]
    done: list[Done] = []
    cut: list[bool] = []
    watcher = asyncio.create_task(_cut_at_grace(handles, state, cut))
    try:
        if start := dialect.start(len(handles)):
            yield encode(start)
        async for group in _events(handles):
            items: list[SSEItem] = []
            for ev in group:
                if isinstance(ev, Chunk):
                    events = outputs[ev.index].feed(ev)
                else:
                    if ev.finish_reason == "error":
                        items.append(dialect.error_event(ev.error or "generation failed", "server_error"))
                    elif ev.finish_reason == "cancelled" and cut:
                        items.append(dialect.error_event(shutting_down("stream", state.grace_s), "shutting_down"))
                    events = outputs[ev.index].end(ev)
                for out in events:
                    if isinstance(out, Done):
                        done.append(out)
                    items += dialect.on(out)
            if items:
                yield encode(items)
        items = dialect.end(sorted(done, key=lambda d: d.index))
        if dialect.terminal is not None:
            items.append({"data": dialect.terminal})
        if items:
            yield encode(items)
    finally:
        watcher.cancel()
        for h in handles:
            h.cancel()


def sse_data(obj: Any, event: str | None = None) -> SSEItem:
    """An SSE item whose data is obj as JSON; named when event is given (OpenAI's chat names none)."""
    item = {"data": json.dumps(obj)}
    if event is not None:
        item["event"] = event
    return item
