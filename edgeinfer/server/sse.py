"""Server-sent events: an answer's events framed as bytes, each group sent as it comes, a comment every 15 s.

Starlette's StreamingResponse sends each chunk straight to the connection and ends the
stream when its client leaves; an EventStream adds the keep-alive comment (a client's read
timeout must not fire during a long prompt) and closes its generator at once when the
response ends, so the streams it reads are cancelled then rather than at garbage collection.
The framing is done once per group of events (a step's tokens together): the SSE library
used before wrapped every send in a cancel scope and framed each event through its own
object, a third of the event loop's CPU per streamed token (scripts/server_cpu.py), and on
two cores the loop's CPU is taken from llama.cpp's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable

from starlette.responses import StreamingResponse
from starlette.types import Send

SSEItem = dict[str, str]  # one event: {"event": name, "data": text}; "event" optional
PING_S = 15.0
PING = b": ping\n\n"


def encode(items: Iterable[SSEItem]) -> bytes:
    """The events as SSE text: an `event:` line when named, a `data:` line for each line of the data."""
    out = []
    for item in items:
        if "event" in item:
            out.append(f"event: {item['event']}\n")
        data = item["data"]
        out.append(
            f"data: {data}\n\n" if "\n" not in data else "".join(f"data: {x}\n" for x in data.split("\n")) + "\n"
        )
    return "".join(out).encode()


class EventStream(StreamingResponse):
    """A text/event-stream response of the byte chunks its generator yields (encode's output)."""

    def __init__(self, chunks: AsyncGenerator[bytes, None]) -> None:
        super().__init__(
            chunks, media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )
        self.chunks = chunks

    async def stream_response(self, send: Send) -> None:
        pinger = asyncio.create_task(_ping(send))
        try:
            await super().stream_response(send)
        finally:
            pinger.cancel()
            await self.chunks.aclose()  # its cleanup now (a client gone, the server cut): cancel what it reads


async def _ping(send: Send) -> None:
    """A comment every PING_S (SSE clients skip comments): the connection is alive while nothing else comes."""
    with contextlib.suppress(OSError):  # the client has gone: the response ends without it
        while True:
            await asyncio.sleep(PING_S)
            await send({"type": "http.response.body", "body": PING, "more_body": True})
