"""What every route shares: the server's state, the API-key check, and errors in the shape of the API asked."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException

from edgeinfer.engine import Engine
from edgeinfer.errors import EdgeInferError, EngineClosedError
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


def server_state(request: Request) -> ServerState:
    return request.app.state.edgeinfer  # type: ignore[no-any-return]


async def authorized(request: Request) -> None:
    """The --api-key check: `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY` (Anthropic's)."""
    key = server_state(request).api_key
    if key is None:
        return
    bearer = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
    plain = request.headers.get("x-api-key", "").encode("utf-8", "surrogateescape")
    # Constant time, and both compared whichever was sent: the time taken must not tell a guesser
    # how many leading bytes were right, nor which header the server read.
    good_bearer = hmac.compare_digest(bearer, f"Bearer {key}".encode())
    good_plain = hmac.compare_digest(plain, key.encode())
    if not (good_bearer or good_plain):
        raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")


class ErrorShape(Protocol):
    """An API's error body. type_ is OpenAI's vocabulary (invalid_request_error, authentication_error,
    server_error); a shape maps it, and the status, onto its own."""

    def __call__(
        self, status: int, message: str, type_: str, param: str | None, code: str | None
    ) -> dict[str, Any]: ...


def _openai_shape(status: int, message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return error_body(message, type_, param, code)


# Path prefix -> the error body of the API served there; OpenAI's everywhere else. A dialect's
# module registers its own at import (ERROR_SHAPES["/v1/messages"] = ...), so that the app's
# handlers (a body that fails validation, a wrong key, an engine error) answer in its shape.
ERROR_SHAPES: dict[str, ErrorShape] = {}


def error_shape(path: str) -> ErrorShape:
    """The error shape for a request path: the longest registered prefix that matches."""
    found = [p for p in ERROR_SHAPES if path == p or path.startswith(p.rstrip("/") + "/")]
    return ERROR_SHAPES[max(found, key=len)] if found else _openai_shape


def error_response(
    request: Request,
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error answer in the shape of the API the request was sent to."""
    body = error_shape(request.url.path)(status, message, type_, param, code)
    return JSONResponse(body, status_code=status, headers=headers)
