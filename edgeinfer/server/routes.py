"""The endpoints every API shares: health, models, metrics and the stats feed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sse_starlette import EventSourceResponse

from edgeinfer.errors import RequestError
from edgeinfer.server.state import authorized, server_state

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


router.include_router(guarded)
