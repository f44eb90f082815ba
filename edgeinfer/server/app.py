"""The ASGI app: OpenAI-compatible endpoints over the engine, plus health, metrics and stats."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from edgeinfer.engine import Engine, StreamHandle
from edgeinfer.errors import EdgeInferError, EngineClosedError, QueueFullError, RequestError
from edgeinfer.events import Chunk, Finish
from edgeinfer.server import wire
from edgeinfer.server.metrics import EngineCollector
from edgeinfer.server.schema import ChatRequest, CompletionRequest, error_body


class ServerState:
    """The engine once loaded, or why it is not there yet."""

    def __init__(self, factory: Callable[[], Engine], model_id: str) -> None:
        self.factory = factory
        self.model_id = model_id
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.started = time.time()
        # Run at shutdown after the engine closes (e.g. removing the socket file): uvicorn
        # re-raises SIGTERM once it has shut down, so code after it never runs.
        self.on_close: list[Callable[[], None]] = []

    def load(self) -> None:
        try:
            self.engine = self.factory()
        except EdgeInferError as e:
            self.load_error = str(e)
        except Exception as e:
            self.load_error = f"model load failed: {e!r}"

    def ready(self) -> Engine:
        if self.engine is None:
            if self.load_error:
                raise EngineClosedError(f"the model failed to load: {self.load_error}")
            raise EngineClosedError("the model is still loading; retry when /health answers 200")
        return self.engine


def make_app(
    factory: Callable[[], Engine], model_id: str, api_key: str | None = None, load_in_background: bool = True
) -> FastAPI:
    """Build the app; the engine is made by `factory` at startup (in a thread, so /health answers 503 meanwhile)."""
    state = ServerState(factory, model_id)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if load_in_background:
            threading.Thread(target=state.load, name="edgeinfer-load", daemon=True).start()
        else:
            state.load()
        yield
        if state.engine is not None:
            await asyncio.to_thread(state.engine.close)
        for fn in state.on_close:
            fn()

    app = FastAPI(title="edgeinfer", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.edgeinfer = state
    registry = CollectorRegistry()
    registry.register(EngineCollector(lambda: state.engine))

    async def authorized(request: Request) -> None:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer KEY'")

    _error_handlers(app)
    guarded = [Depends(authorized)]

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.engine is not None:
            return JSONResponse({"status": "ok"})
        if state.load_error:
            return JSONResponse({"status": "error", "error": state.load_error}, status_code=500)
        return JSONResponse({"status": "loading"}, status_code=503)

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model_id, "object": "model", "created": int(state.started), "owned_by": "edgeinfer"}],
        }

    @app.get("/metrics", dependencies=guarded)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/edgeinfer/stats", dependencies=guarded)
    async def stats() -> dict[str, Any]:
        return state.ready().snapshot()

    @app.get("/v1/edgeinfer/stats/stream", dependencies=guarded)
    async def stats_stream(interval: float = 1.0) -> EventSourceResponse:
        engine = state.ready()
        if not 0.05 <= interval <= 60:
            raise RequestError("interval must be between 0.05 and 60 seconds", "interval")

        async def feed() -> AsyncIterator[dict[str, str]]:
            while True:
                yield {"data": json.dumps(engine.snapshot())}
                await asyncio.sleep(interval)

        return EventSourceResponse(feed())

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(req: ChatRequest) -> Any:
        engine = state.ready()
        _check_model(req.model, model_id)
        params = req.to_sampling()
        prompt = engine.chat_prompt(req.chat_messages())
        handles = await engine.asubmit(prompt, params, n=req.n)
        fmt = wire.ChatFormat(model_id, req.logprobs)
        return await _respond(handles, fmt, req.stream, bool(req.stream_options and req.stream_options.include_usage))

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(req: CompletionRequest) -> Any:
        engine = state.ready()
        _check_model(req.model, model_id)
        params = req.to_sampling()
        prompt = req.prompt[0] if isinstance(req.prompt, list) and isinstance(req.prompt[0], str) else req.prompt
        handles = await engine.asubmit(prompt, params, n=req.n)
        fmt = wire.CompletionFormat(model_id, req.logprobs is not None)
        return await _respond(handles, fmt, req.stream, bool(req.stream_options and req.stream_options.include_usage))

    return app


def _check_model(name: str, model_id: str) -> None:
    if name not in (model_id, "default"):
        raise ModelNotFound(f"model {name!r} is not served here; GET /v1/models lists {model_id!r}")


class ModelNotFound(EdgeInferError):
    http_status = 404
    code = "model_not_found"


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


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = ".".join(loc) or None
        if err.get("type") == "json_invalid":
            message = f"the request body is not valid JSON ({err.get('msg')})"
        elif err.get("type") == "missing":
            message = f"{param} is required"
        elif err.get("type") == "extra_forbidden":
            message = f"{param} is not a supported field"
        else:
            message = f"{param}: {err.get('msg')}" if param else str(err.get("msg"))
        return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

    @app.exception_handler(EdgeInferError)
    async def engine_error(request: Request, exc: EdgeInferError) -> JSONResponse:
        headers = {"Retry-After": "1"} if isinstance(exc, QueueFullError | EngineClosedError) else None
        param = getattr(exc, "param", None)
        kind = "invalid_request_error" if exc.http_status < 500 else "server_error"
        return JSONResponse(error_body(str(exc), kind, param, exc.code), status_code=exc.http_status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
        return JSONResponse(error_body(str(message), kind), status_code=exc.status_code)
