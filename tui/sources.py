"""Where the dashboard's snapshots come from: a server's Unix socket, an in-process engine, or a script (tests).

A source is an async iterator of StatsUpdate and FeedDown messages that never ends by itself:
outages are reported and retried inside it, so the dashboard only has to show what it yields.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, Protocol

import httpx
from httpx_sse import aconnect_sse
from pydantic import ValidationError

from edgeinfer.engine.stats import EngineStats

from .messages import FeedDown, StatsUpdate

STREAM_PATH = "/v1/edgeinfer/stats/stream"

Event = StatsUpdate | FeedDown


class StatsSource(Protocol):
    """Anything the dashboard can read snapshots from."""

    label: str  # where the figures come from, shown in the status line

    def events(self) -> AsyncIterator[Event]: ...


def serve_hint(path: Path) -> str:
    """The command that starts a server at path (the plain one when path is the default)."""
    from edgeinfer.server.listen import default_socket_path

    if path == default_socket_path():
        return "start `edgeinfer serve`"
    return f"start `edgeinfer serve --socket {path}`"


class SocketSource:
    """Reads `edgeinfer serve`'s SSE stats stream over its Unix socket; reconnects for ever."""

    def __init__(
        self,
        path: str | Path,
        api_key: str | None = None,
        interval: float = 1.0,
        retry_s: float = 1.0,
        stall_s: float | None = None,
    ) -> None:
        self.path = Path(path).expanduser()
        self.api_key = api_key
        self.interval = interval  # seconds between snapshots, asked of the server
        self.retry_s = retry_s  # seconds between connection attempts
        # A feed silent this long is stalled: drop it and connect again.
        self.stall_s = stall_s if stall_s is not None else 3 * interval + 2.0
        self.label = f"unix:{self.path}"

    async def events(self) -> AsyncIterator[Event]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(self.path)),
            base_url="http://edgeinfer",
            headers=headers,
            timeout=httpx.Timeout(self.stall_s, connect=2.0),
        ) as client:
            while True:
                async for event in self._connection(client):
                    yield event
                await asyncio.sleep(self.retry_s)

    async def _connection(self, client: httpx.AsyncClient) -> AsyncIterator[Event]:
        """One connection: snapshots until it ends, then one FeedDown saying why."""
        again = f"retrying every {self.retry_s:g} s"
        try:
            async with aconnect_sse(client, "GET", STREAM_PATH, params={"interval": self.interval}) as feed:
                r = feed.response
                if r.status_code != 200:
                    yield self._refused(r.status_code, await r.aread())
                    return
                async for sse in feed.aiter_sse():
                    yield StatsUpdate(EngineStats.model_validate_json(sse.data), served_of(sse.data))
            yield FeedDown(f"the server at {self.path} ended the stats stream", again)
        except httpx.ConnectError:
            yield FeedDown(f"no server at {self.path}", f"{serve_hint(self.path)}; {again}")
        except httpx.ReadTimeout:
            yield FeedDown(f"no stats from {self.path} for {self.stall_s:g} s: the feed stalled", again)
        except httpx.TransportError as e:
            yield FeedDown(f"lost the server at {self.path} ({type(e).__name__})", again)
        except ValidationError:
            yield FeedDown(f"the server at {self.path} sent a snapshot that is not an edgeinfer snapshot", again)

    def _refused(self, status: int, body: bytes) -> FeedDown:
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body.decode("utf-8", "replace")[:200]
        if status == 401:
            return FeedDown(f"the server at {self.path} refused the API key", "pass --api-key KEY")
        if status == 503:
            return FeedDown(f"the server at {self.path} is not ready: {message}", "waiting for it")
        return FeedDown(f"the server at {self.path} answered {status}: {message}", f"retrying every {self.retry_s:g} s")


def served_of(data: str) -> list[tuple[str, bool]]:
    """The models a server serves, from its snapshot's "served" list: (id, loaded) each; [] when it has none."""
    try:
        served = json.loads(data).get("served") or []
        return [(str(m["id"]), bool(m["loaded"])) for m in served]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


class EngineSource:
    """Polls an in-process engine's snapshot() in a worker thread, so a busy engine never blocks the UI."""

    def __init__(self, engine: Any, interval: float = 1.0, stall_s: float | None = None) -> None:
        self.engine = engine
        self.interval = interval
        self.stall_s = stall_s if stall_s is not None else 3 * interval + 2.0
        self.label = "in-process engine"

    async def events(self) -> AsyncIterator[Event]:
        # At most one snapshot() call in flight: a stuck one is waited for, not piled on.
        pending: asyncio.Future[EngineStats] | None = None
        while True:
            if pending is None:
                pending = asyncio.ensure_future(asyncio.to_thread(self.engine.snapshot))
            done, _ = await asyncio.wait({pending}, timeout=self.stall_s)
            if not done:
                yield FeedDown(f"the engine has not answered for {self.stall_s:g} s", "waiting for it")
                continue
            call, pending = pending, None
            try:
                snapshot = call.result()
            except Exception as e:
                yield FeedDown(f"the engine's snapshot failed: {e}", "retrying")
            else:
                yield StatsUpdate(snapshot)
            await asyncio.sleep(self.interval)


class ScriptedSource:
    """Plays snapshots (dicts) and outages (strings) in order, then waits for more from push(); for tests."""

    def __init__(self, items: Iterable[dict[str, Any] | str] = (), label: str = "script") -> None:
        self.label = label
        self._queue: asyncio.Queue[dict[str, Any] | str] = asyncio.Queue()
        for item in items:
            self._queue.put_nowait(item)

    def push(self, item: dict[str, Any] | str) -> None:
        self._queue.put_nowait(item)

    async def events(self) -> AsyncIterator[Event]:
        while True:
            item = await self._queue.get()
            yield StatsUpdate(EngineStats.model_validate(item)) if isinstance(item, dict) else FeedDown(item)
