"""The ASGI app: the factories (make_server, make_app) and the server's state; the routes are in routes.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException

from edgeinfer.engine import Engine, make_engine
from edgeinfer.errors import EdgeInferError, EngineClosedError, QueueFullError
from edgeinfer.models.catalog import model_id_of
from edgeinfer.options import EngineConfig
from edgeinfer.server.limits import DEFAULT_MAX_BODY_MB, BodyLimit
from edgeinfer.server.prometheus import EngineCollector
from edgeinfer.server.schema import error_body


class ServerState:
    """The engine once loaded, or why it is not there yet; what the routes share."""

    def __init__(self, factory: Callable[[], Engine], model_id: str, api_key: str | None) -> None:
        self.factory = factory
        self.model_id = model_id
        self.api_key = api_key
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.started = time.time()
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(lambda: self.engine))
        # Run at shutdown after the engine closes (e.g. removing the socket file): uvicorn
        # re-raises SIGTERM once it has shut down, so code after it never runs.
        self.on_close: list[Callable[[], None]] = []
        # Shutdown: requests in flight get grace_s seconds from shutdown_at (time.monotonic(),
        # set by listen.serve on SIGTERM/SIGINT) to finish; then they are cancelled.
        self.grace_s = 10.0
        self.shutdown_at: float | None = None

    def grace_left(self) -> float | None:
        """Seconds of the shutdown grace left; None while the server is not shutting down."""
        if self.shutdown_at is None:
            return None
        return self.shutdown_at + self.grace_s - time.monotonic()

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


def make_server(
    config: EngineConfig,
    api_key: str | None = None,
    load_in_background: bool = True,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
) -> FastAPI:
    """The ASGI app over an engine made from config (the CLI and the tests use this)."""
    factory = lambda: make_engine(config)  # noqa: E731
    return make_app(factory, model_id_of(config.model), api_key, load_in_background, max_body_mb)


def make_app(
    factory: Callable[[], Engine],
    model_id: str,
    api_key: str | None = None,
    load_in_background: bool = True,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
) -> FastAPI:
    """Build the app; the engine is made by `factory` at startup (in a thread, so /health answers 503 meanwhile).

    Request bodies over max_body_mb MiB are refused with 413 before they are parsed.
    """
    from edgeinfer.server.routes import router

    state = ServerState(factory, model_id, api_key)

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
    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(EdgeInferError, engine_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.include_router(router)
    app.add_middleware(BodyLimit, max_bytes=int(max_body_mb * 2**20))
    return app


async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body that does not fit the schema: 400 naming the field, as OpenAI does."""
    errors = exc.errors()
    # Of a union's errors (content: str | list), the one that is not a plain type mismatch says most.
    err = next((e for e in errors if not str(e.get("type", "")).endswith("_type")), errors[0])
    loc = [str(x) for x in err.get("loc", ()) if x != "body" and not _union_tag(x)]
    param = ".".join(loc) or None
    if err.get("type") == "json_invalid":
        message = f"the request body is not valid JSON ({err.get('msg')})"
    elif err.get("type") == "missing":
        message = f"{param} is required"
    elif err.get("type") == "extra_forbidden":
        message = f"{param} is not a supported field"
    else:
        msg = str(err.get("msg")).removeprefix("Value error, ")
        message = f"{param}: {msg}" if param else msg
    return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)


def _union_tag(x: Any) -> bool:
    """pydantic names a union's member in the error location ("str", "list[TextPart]"): not a field."""
    return isinstance(x, str) and (x in ("str", "int", "float", "bool") or "[" in x)


async def engine_error(request: Request, exc: EdgeInferError) -> JSONResponse:
    headers = {"Retry-After": "1"} if isinstance(exc, QueueFullError | EngineClosedError) else None
    param = getattr(exc, "param", None)
    kind = "invalid_request_error" if exc.http_status < 500 else "server_error"
    return JSONResponse(error_body(str(exc), kind, param, exc.code), status_code=exc.http_status, headers=headers)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
    message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
    bad = exc.__cause__
    if isinstance(bad, UnicodeDecodeError):  # FastAPI's "error parsing the body", said precisely
        byte = bad.object[bad.start]
        message = f"the request body is not valid UTF-8 (byte {byte:#04x} at offset {bad.start}); send UTF-8 JSON"
    return JSONResponse(error_body(str(message), kind), status_code=exc.status_code)
