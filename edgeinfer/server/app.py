"""The ASGI app: the factories (make_server, make_app) and its error handlers; the state is in state.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from edgeinfer.engine import Engine
from edgeinfer.errors import EdgeInferError, EngineClosedError, ModelLoadingError, QueueFullError
from edgeinfer.options import EngineConfig
from edgeinfer.server import embeddings, messages, openai_chat, responses, routes, tokens
from edgeinfer.server.api import Api, ErrorShapes
from edgeinfer.server.limits import DEFAULT_MAX_BODY_MB, BodyLimit
from edgeinfer.server.pool import DEFAULT_LOAD_TIMEOUT_S, ModelPool, ModelSpec, Serving, model_specs
from edgeinfer.server.state import ServerState, error_response

# Every API the server speaks, each declared at the end of its module (server/api.py). A new dialect adds its
# module's API here.
APIS: list[Api] = [routes.API, openai_chat.API, responses.API, messages.API, tokens.API, embeddings.API]


def make_server(
    config: EngineConfig,
    api_key: str | None = None,
    load_in_background: bool = True,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    serving: Serving | None = None,
) -> FastAPI:
    """The ASGI app over engines made from config (the CLI and the tests use this): config.model alone, or
    the models `serving` names (the first is the default), each with config's other options."""
    pool = ModelPool(
        model_specs(config, serving.models if serving else [], serving.models_dir if serving else None),
        max_models=serving.max_models if serving else 0,
        idle_unload_s=serving.idle_unload_s if serving else 0.0,
        load_timeout_s=serving.load_timeout_s if serving else DEFAULT_LOAD_TIMEOUT_S,
        aliases=serving.aliases if serving else None,
    )
    return make_pool_app(pool, api_key, load_in_background, max_body_mb)


def make_app(
    factory: Callable[[], Engine],
    model_id: str,
    api_key: str | None = None,
    load_in_background: bool = True,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    apis: list[Api] | None = None,
) -> FastAPI:
    """The app over one model whose engine `factory` makes (tests hand it a fake)."""
    pool = ModelPool([ModelSpec(model_id, None, factory)])
    return make_pool_app(pool, api_key, load_in_background, max_body_mb, apis)


def make_pool_app(
    pool: ModelPool,
    api_key: str | None = None,
    load_in_background: bool = True,
    max_body_mb: float = DEFAULT_MAX_BODY_MB,
    apis: list[Api] | None = None,
) -> FastAPI:
    """Build the app; the default model is loaded at startup (in a thread, so /health answers 503 meanwhile),
    the others on their first request.

    Request bodies over max_body_mb MiB are refused with 413 before they are parsed. apis: the APIs it speaks
    (default: APIS, every one).
    """
    apis = APIS if apis is None else apis
    state = ServerState(None, pool.default, api_key, pool)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if load_in_background:
            threading.Thread(target=state.load, name="edgeinfer-load", daemon=True).start()
        else:
            state.load()
        pool.start_sweeper()
        yield
        await asyncio.to_thread(pool.close)
        for fn in state.on_close:
            fn()

    app = FastAPI(title="edgeinfer", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.edgeinfer = state
    app.add_exception_handler(RequestValidationError, invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(EdgeInferError, engine_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    state.error_shape = ErrorShapes(apis)
    for api in apis:
        app.include_router(api.router)
    app.add_middleware(BodyLimit, max_bytes=int(max_body_mb * 2**20), error_shape=state.error_shape)
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
    return error_response(request, 400, message, "invalid_request_error", param)


def _union_tag(x: Any) -> bool:
    """pydantic names a union's member in the error location ("str", "list[TextPart]"): not a field."""
    return isinstance(x, str) and (x in ("str", "int", "float", "bool") or "[" in x)


async def engine_error(request: Request, exc: EdgeInferError) -> JSONResponse:
    headers = {"Retry-After": "1"} if isinstance(exc, QueueFullError | EngineClosedError) else None
    if isinstance(exc, ModelLoadingError):
        headers = {"Retry-After": str(exc.retry_after)}
    param = getattr(exc, "param", None)
    kind = "invalid_request_error" if exc.http_status < 500 else "server_error"
    return error_response(request, exc.http_status, str(exc), kind, param, exc.code, headers)


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
    message = exc.detail if exc.status_code != 404 else f"no route {request.method} {request.url.path}"
    bad = exc.__cause__
    if isinstance(bad, UnicodeDecodeError):  # FastAPI's "error parsing the body", said precisely
        byte = bad.object[bad.start]
        message = f"the request body is not valid UTF-8 (byte {byte:#04x} at offset {bad.start}); send UTF-8 JSON"
    return error_response(request, exc.status_code, str(message), kind)
