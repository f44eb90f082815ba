"""The endpoints every API shares: health, models, metrics and the stats feed (of each served model)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from edgeinfer.errors import EdgeInferError, EngineClosedError, RequestError
from edgeinfer.server.api import Api
from edgeinfer.server.sse import EventStream, encode
from edgeinfer.server.state import ServerState, authorized, server_state

router = APIRouter()
guarded = APIRouter(dependencies=[Depends(authorized)])


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """ok once the default model's first load has ended well (the others load on demand); 503 while it loads,
    500 if it failed, 503 once an engine has stopped for good."""
    state = server_state(request)
    fatal = state.fatal_error()
    if fatal is not None:
        return JSONResponse({"status": "error", "error": fatal}, status_code=503)
    if not state.loaded_once and state.engine is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    if state.load_error:
        return JSONResponse({"status": "error", "error": state.load_error}, status_code=500)
    return JSONResponse({"status": "ok"})


@guarded.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """Every servable model in OpenAI's shape, with what it is beside (status: unloaded, queued, loading,
    loaded, draining, unloading; loaded: in memory now; path; error of a failed load; note)."""
    state = server_state(request)
    base = {"object": "model", "created": int(state.started), "owned_by": "edgeinfer"}
    return {"object": "list", "data": [{**entry, **base} for entry in state.pool.describe()]}


@guarded.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(generate_latest(server_state(request).registry), media_type=CONTENT_TYPE_LATEST)


@guarded.get("/v1/edgeinfer/stats")
async def stats(request: Request, model: str | None = None) -> dict[str, Any]:
    """The named model's engine now (the default's without ?model=), and the served models beside it."""
    return _stats(server_state(request), model)


@guarded.get("/v1/edgeinfer/stats/stream")
async def stats_stream(request: Request, interval: float = 1.0, model: str | None = None) -> EventStream:
    state = server_state(request)
    first = _stats(state, model)
    if not 0.05 <= interval <= 60:
        raise RequestError("interval must be between 0.05 and 60 seconds", "interval")

    async def feed() -> AsyncGenerator[bytes, None]:
        snap = first
        while True:
            yield encode([{"data": json.dumps(snap)}])
            if not await state.sleep_unless_shutting_down(interval):
                return  # the server is stopping: a dashboard reconnects, or says it is gone
            try:
                snap = _stats(state, model)
            except EdgeInferError:  # the model was unloaded: the stream ends; reconnecting says why (a 503)
                return

    return EventStream(feed())


def _stats(state: ServerState, model: str | None) -> dict[str, Any]:
    """An engine's snapshot as JSON, with "served": each servable model and whether it is loaded.
    Without a model named, the default's, or while it is unloaded the most recently used model's.
    Reading stats never loads a model: one not in memory is a 503 saying so."""
    slot = state.pool.find(model)
    if model is None and slot.engine is None and state.loaded_once:
        slot = state.pool.most_recent() or slot
    snap = state.pool.read(lambda e: e.snapshot(), slot.name)
    if not snap:
        if slot.name == state.model_id and not state.loaded_once:
            state.ready()  # raises: the default model is still loading, or failed to
        raise EngineClosedError(f"model {slot.name!r} is not loaded now (status {slot.state}); ask it something first")
    doc: dict[str, Any] = snap[0][1].model_dump(mode="json")
    doc["served_model"] = slot.name
    doc["served"] = [{k: m[k] for k in ("id", "status", "loaded")} for m in state.pool.describe()]
    doc["ignored_fields"] = state.ignored.snapshot()
    return doc


router.include_router(guarded)


API = Api("routes", router)  # health, models, metrics, stats; errors in OpenAI's shape
