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
from starlette.exceptions import HTTPException

from edgeinfer.engine import StreamHandle
from edgeinfer.errors import EdgeInferError, RequestError
from edgeinfer.events import Chunk, Finish
from edgeinfer.server import wire
from edgeinfer.server.app import ServerState
from edgeinfer.server.schema import ChatRequest, CompletionRequest, error_body


def server_state(request: Request) -> ServerState:
    return request.app.state.edgeinfer  # type: ignore[no-any-return]


async def authorized(request: Request) -> None:
    key = server_state(request).api_key
    if key is not None and request.headers.get("authorization") != f"Bearer {key}":
        raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer KEY'")


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
    prompt = engine.chat_prompt(req.chat_messages())
    handles = await engine.asubmit(prompt, req.to_sampling(), n=req.n)
    fmt = wire.ChatFormat(state.model_id, req.logprobs)
    return await _respond(handles, fmt, req.stream, bool(req.stream_options and req.stream_options.include_usage))


@guarded.post("/v1/completions")
async def completions(request: Request, req: CompletionRequest) -> Any:
    state = server_state(request)
    engine = state.ready()
    _check_model(req.model, state.model_id)
    handles = await engine.asubmit(req.prompt_input(), req.to_sampling(), n=req.n)
    fmt = wire.CompletionFormat(state.model_id, req.logprobs is not None)
    return await _respond(handles, fmt, req.stream, bool(req.stream_options and req.stream_options.include_usage))


router.include_router(guarded)


class ModelNotFound(EdgeInferError):
    http_status = 404
    code = "model_not_found"


def _check_model(name: str, model_id: str) -> None:
    if name not in (model_id, "default"):
        raise ModelNotFound(f"model {name!r} is not served here; GET /v1/models lists {model_id!r}")


async def _respond(handles: list[StreamHandle], fmt: wire.Format, stream: bool, include_usage: bool) -> Any:
    if stream:
        return EventSourceResponse(_sse(handles, fmt, include_usage), ping=15)
    try:
        finishes = await asyncio.gather(*(h.aresult() for h in handles))
    except asyncio.CancelledError:
        for h in handles:
            h.cancel()
        raise
    failed = next((f for f in finishes if f.finish_reason == "error"), None)
    if failed is not None:
        return JSONResponse(error_body(failed.error or "generation failed", "server_error"), status_code=500)
    return fmt.response(list(finishes))


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


async def _sse(handles: list[StreamHandle], fmt: wire.Format, include_usage: bool) -> AsyncIterator[dict[str, str]]:
    """Merge the n streams' events into one SSE stream; a disconnect cancels every stream."""
    finishes: list[Finish] = []
    try:
        if fmt.sends_role:
            for i in range(len(handles)):
                yield {"data": json.dumps(fmt.first_chunk(i))}
        async for ev in _events(handles):
            if isinstance(ev, Chunk):
                if ev.text or ev.logprob is not None:
                    yield {"data": json.dumps(fmt.chunk(ev))}
            else:
                finishes.append(ev)
                if ev.finish_reason == "error":
                    yield {"data": json.dumps(error_body(ev.error or "generation failed", "server_error"))}
                yield {"data": json.dumps(fmt.final_chunk(ev))}
        if include_usage:
            yield {"data": json.dumps(fmt.usage_chunk(finishes))}
        yield {"data": "[DONE]"}
    finally:
        for h in handles:
            h.cancel()
