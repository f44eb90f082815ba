"""The endpoints: OpenAI's chat and text completions and models, plus health, metrics and the stats feed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sse_starlette import EventSourceResponse

from edgeinfer.engine import Engine, StreamHandle
from edgeinfer.errors import EdgeInferError, RequestError
from edgeinfer.events import Chunk, Finish
from edgeinfer.options import Grammar, SamplingParams
from edgeinfer.server import tools, wire
from edgeinfer.server.schema import ChatRequest, CompletionRequest, error_body
from edgeinfer.server.state import ServerState, authorized, server_state

router = APIRouter()
guarded = APIRouter(dependencies=[Depends(authorized)])


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    state = server_state(request)
    if state.engine is not None and state.engine.fatal_error is not None:
        return JSONResponse({"status": "error", "error": state.engine.fatal_error}, status_code=503)
    if state.engine is not None:
        return JSONResponse({"status": "ok"})
    if state.load_error:
        return JSONResponse({"status": "error", "error": state.load_error}, status_code=500)
    return JSONResponse({"status": "loading"}, status_code=503)


@guarded.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    state = server_state(request)
    entry = {"id": state.model_id, "object": "model", "created": int(state.started), "owned_by": "edgeinfer"}
    return {"object": "list", "data": [entry]}


@guarded.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(server_state(request).registry), media_type=CONTENT_TYPE_LATEST)


@guarded.get("/v1/edgeinfer/stats")
async def stats(request: Request) -> dict[str, Any]:
    return server_state(request).ready().snapshot().model_dump(mode="json")


@guarded.get("/v1/edgeinfer/stats/stream")
async def stats_stream(request: Request, interval: float = 1.0) -> EventSourceResponse:
    engine = server_state(request).ready()
    if not 0.05 <= interval <= 60:
        raise RequestError("interval must be between 0.05 and 60 seconds", "interval")

    async def feed() -> AsyncIterator[dict[str, str]]:
        while True:
            yield {"data": engine.snapshot().model_dump_json()}
            await asyncio.sleep(interval)

    return EventSourceResponse(feed())


@guarded.post("/v1/chat/completions")
async def chat_completions(request: Request, req: ChatRequest) -> Any:
    state = server_state(request)
    engine = state.ready()
    _check_model(req.model, state.model_id)
    # Templating and tokenizing take time in proportion to the prompt: off the event loop.
    prompt, params = await asyncio.to_thread(_chat_input, engine, req)
    handles = await _submit(engine, prompt, params, req.n)
    fmt = wire.ChatFormat(state.model_id, req.logprobs, tools.uses_tools(req))
    usage = bool(req.stream_options and req.stream_options.include_usage)
    return await _respond(request, state, handles, fmt, req.stream, usage)


@guarded.post("/v1/completions")
async def completions(request: Request, req: CompletionRequest) -> Any:
    state = server_state(request)
    engine = state.ready()
    _check_model(req.model, state.model_id)
    prompt = req.prompt_input()
    if isinstance(prompt, str) and prompt:
        prompt = await asyncio.to_thread(engine.tokenize, prompt)
    handles = await _submit(engine, prompt, req.to_sampling(), req.n)
    fmt = wire.CompletionFormat(state.model_id, req.logprobs is not None)
    usage = bool(req.stream_options and req.stream_options.include_usage)
    return await _respond(request, state, handles, fmt, req.stream, usage)


router.include_router(guarded)


def _chat_input(engine: Engine, req: ChatRequest) -> tuple[list[int], SamplingParams]:
    """The prompt (messages, and tools where the template writes them) and the sampling, grammar included."""
    native = tools.uses_tools(req) and engine.template.renders_tools
    messages = tools.chat_messages(req, native)
    prompt = engine.chat_prompt(messages, [t.model_dump() for t in req.tools or []] if native else None)
    fmt = req.response_format.grammar() if req.response_format is not None else None
    grammar = tools.tools_grammar(req) or fmt
    if tools.uses_tools(req):
        assert req.tools is not None
        if fmt is not None:
            engine.grammars.compile(fmt)
        for i, t in enumerate(req.tools):  # each schema on its own, so that an error names its tool
            if t.function.parameters is not None:
                engine.grammars.compile(
                    Grammar(
                        kind="json_schema",
                        source=json.dumps(t.function.parameters),
                        origin=f"tools[{i}].function.parameters",
                    )
                )
    return prompt, req.to_sampling(grammar)


class ModelNotFound(EdgeInferError):
    http_status = 404
    code = "model_not_found"


def _check_model(name: str, model_id: str) -> None:
    if name not in (model_id, "default"):
        raise ModelNotFound(f"model {name!r} is not served here; GET /v1/models lists {model_id!r}")


async def _submit(engine: Engine, prompt: str | list[int], params: SamplingParams, n: int) -> list[StreamHandle]:
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


POLL_S = 0.2  # how often a waiting request looks for its client leaving or the grace running out
CUT_MARGIN_S = 5.0  # after the grace, time for cancelled streams to send their end before the hard cut


async def _respond(
    request: Request, state: ServerState, handles: list[StreamHandle], fmt: wire.Format, stream: bool, usage: bool
) -> Any:
    if stream:
        return EventSourceResponse(
            _sse(handles, fmt, usage, state),
            ping=15,
            # sse-starlette cuts every stream as soon as it sees the server shutting down, unless
            # given a grace period. _sse itself ends the stream cleanly when the grace runs out;
            # the library's cut, CUT_MARGIN_S later, is the backstop should the engine not answer.
            shutdown_grace_period=state.grace_s + CUT_MARGIN_S,
        )
    results = asyncio.ensure_future(asyncio.gather(*(h.aresult() for h in handles)))
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
                return JSONResponse(_shutting_down("request", state.grace_s), status_code=503)
        finishes = results.result()
    except asyncio.CancelledError:
        _cancel(handles, results)
        raise
    failed = next((f for f in finishes if f.finish_reason == "error"), None)
    if failed is not None:
        return JSONResponse(error_body(failed.error or "generation failed", "server_error"), status_code=500)
    return fmt.response(list(finishes))


def _shutting_down(what: str, grace_s: float) -> dict[str, Any]:
    message = f"the server is shutting down; this {what} did not finish within --grace {grace_s:g} s"
    return error_body(message, "server_error", code="shutting_down")


def _cancel(handles: list[StreamHandle], results: asyncio.Future[Any]) -> None:
    for h in handles:
        h.cancel()
    results.cancel()


async def _events(handles: list[StreamHandle]) -> AsyncIterator[Chunk | Finish]:
    """The events of n streams as they come, ending after the last Finish."""
    if len(handles) == 1:
        async for ev in handles[0]:
            yield ev
        return
    queue: asyncio.Queue[Chunk | Finish] = asyncio.Queue()

    async def pump(h: StreamHandle) -> None:
        async for ev in h:
            queue.put_nowait(ev)

    tasks = [asyncio.create_task(pump(h)) for h in handles]
    try:
        left = len(handles)
        while left:
            ev = await queue.get()
            left -= isinstance(ev, Finish)
            yield ev
    finally:
        for t in tasks:
            t.cancel()


async def _cut_at_grace(handles: list[StreamHandle], state: ServerState, cut: list[bool]) -> None:
    """Once shutting down, cancel the streams when the grace runs out, so that _sse still sends
    their end and an error before sse-starlette force-closes the response."""
    while True:
        left = state.grace_left()
        if left is not None and left <= 0:
            cut.append(True)
            for h in handles:
                h.cancel()
            return
        await asyncio.sleep(POLL_S if left is None else min(POLL_S, left))


async def _sse(
    handles: list[StreamHandle], fmt: wire.Format, include_usage: bool, state: ServerState
) -> AsyncIterator[dict[str, str]]:
    """Merge the n streams' events into one SSE stream; a disconnect cancels every stream."""
    finishes: list[Finish] = []
    cut: list[bool] = []
    watcher = asyncio.create_task(_cut_at_grace(handles, state, cut))
    try:
        if fmt.sends_role:
            for i in range(len(handles)):
                yield {"data": json.dumps(fmt.first_chunk(i))}
        async for ev in _events(handles):
            if isinstance(ev, Chunk):
                if (ev.text or ev.logprob is not None) and (chunk := fmt.chunk(ev)) is not None:
                    yield {"data": json.dumps(chunk)}
            else:
                finishes.append(ev)
                if ev.finish_reason == "error":
                    yield {"data": json.dumps(error_body(ev.error or "generation failed", "server_error"))}
                elif ev.finish_reason == "cancelled" and cut:
                    yield {"data": json.dumps(_shutting_down("stream", state.grace_s))}
                for chunk in fmt.final_chunks(ev):
                    yield {"data": json.dumps(chunk)}
        if include_usage:
            yield {"data": json.dumps(fmt.usage_chunk(finishes))}
        yield {"data": "[DONE]"}
    finally:
        watcher.cancel()
        for h in handles:
            h.cancel()
