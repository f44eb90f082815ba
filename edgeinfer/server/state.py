"""What every route shares: the server's state, the API-key check, and errors in the shape of the API asked."""

from __future__ import annotations

import asyncio
import hmac
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fastapi import Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException

from edgeinfer.engine import Engine
from edgeinfer.errors import EngineClosedError
from edgeinfer.server.api import ErrorShapes
from edgeinfer.server.lenient import Ignored
from edgeinfer.server.pool import ModelPool, ModelSpec, Slot
from edgeinfer.server.prometheus import EngineCollector, IgnoredCollector


class ServerState:
    """The models served (a pool of engines, loaded on demand), the default's first load, and what the routes share."""

    def __init__(
        self,
        factory: Callable[[], Engine] | None,
        model_id: str,
        api_key: str | None,
        pool: ModelPool | None = None,
    ) -> None:
        """One model that factory makes, or the models of pool (then factory is None)."""
        if pool is None:
            assert factory is not None, "ServerState needs a factory or a pool"
            pool = ModelPool([ModelSpec(model_id, None, factory)])
        self.pool = pool
        self.model_id = self.pool.default  # the default model's id: requests naming "default" or none get it
        self.api_key = api_key
        self.load_error: str | None = None  # why the default model failed its first load
        self.loaded_once = False  # the default model's first load has ended (well or not)
        self._fatal: str | None = None  # kept once seen: the engine may be closed and gone by the time serve() asks
        self.started = time.time()
        self.ignored = Ignored()  # fields requests carried that mean nothing here, counted per API (lenient.py)
        self.error_shape = ErrorShapes([])  # by path: the served APIs' error shapes (make_pool_app sets them)
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(lambda: self.pool.read(lambda e: (e.snapshot(), e.metrics))))
        self.registry.register(IgnoredCollector(self.ignored))
        # Run at shutdown after the engine closes (e.g. removing the socket file): uvicorn
        # re-raises SIGTERM once it has shut down, so code after it never runs.
        self.on_close: list[Callable[[], None]] = []
        # Shutdown: requests in flight get grace_s seconds from shutdown_at (time.monotonic(),
        # set by listen.serve on SIGTERM/SIGINT) to finish; then they are cancelled.
        self.grace_s = 10.0
        self.shutdown_at: float | None = None

    @property
    def engine(self) -> Engine | None:
        """The default model's engine while it is in memory."""
        return self.pool.engine_of(None)

    @engine.setter
    def engine(self, engine: Engine | None) -> None:
        self.pool.set_engine(engine)

    def fatal_error(self) -> str | None:
        """The first engine that stopped for good (a llama.cpp abort): this process cannot recover from it."""
        if self._fatal is None:
            for name, engine in self.pool.engines():
                if engine.fatal_error is not None:
                    many = len(self.pool.slots) > 1
                    self._fatal = f"{name}: {engine.fatal_error}" if many else str(engine.fatal_error)
                    break
        return self._fatal

    def grace_left(self) -> float | None:
        """Seconds of the shutdown grace left; None while the server is not shutting down."""
        if self.shutdown_at is None:
            return None
        return self.shutdown_at + self.grace_s - time.monotonic()

    async def sleep_unless_shutting_down(self, seconds: float, poll_s: float = 0.2) -> bool:
        """Sleep for seconds; False as soon as the server begins to shut down (looked at every poll_s)."""
        end = time.monotonic() + seconds
        while self.shutdown_at is None:
            left = end - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, poll_s))
        return False

    def load(self) -> None:
        """The default model's first load, at startup; the others load on their first request. Where its layers
        went is the start-up's last line (engine/offload.py)."""
        slot = self.pool.load_now()
        self.load_error = slot.error
        self.loaded_once = True
        if slot.engine is not None and slot.engine.offload is not None:
            print(f"edgeinfer: {slot.engine.offload.line()}", file=sys.stderr, flush=True)

    def ready(self) -> Engine:
        """The default model's engine, for routes that name no model; EngineClosedError while it is not loaded."""
        engine = self.engine
        if engine is None:
            if self.load_error:
                raise EngineClosedError(f"the model failed to load: {self.load_error}")
            raise EngineClosedError("the model is still loading; retry when /health answers 200")
        return engine

    def lease(self, model: str | None) -> AbstractAsyncContextManager[Slot]:
        """`async with state.lease(req.model) as slot`: the named model's engine (slot.engine), loaded on demand."""
        return self.pool.lease(model)


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
    body = server_state(request).error_shape(request.url.path)(status, message, type_, param, code)
    return JSONResponse(body, status_code=status, headers=headers)
