"""Request limits: the body-size cap (413), enforced as the body arrives, before anything parses it."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edgeinfer.server.api import ErrorShapes

DEFAULT_MAX_BODY_MB = 8.0  # a long chat is well under 1 MiB of JSON


def too_large_message(max_bytes: int) -> str:
    return (
        f"the request body is over the server's {max_bytes / 2**20:g} MiB limit; "
        "send less, or start the server with a larger --max-body-mb"
    )


class BodyTooLarge(HTTPException):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, too_large_message(max_bytes))


class BodyLimit:
    """ASGI middleware: a declared Content-Length over the cap is answered 413 at once, unread;
    a chunked body is counted as it arrives and cut at the cap (BodyTooLarge, rendered as 413)."""

    def __init__(self, app: ASGIApp, max_bytes: int, error_shape: ErrorShapes) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.error_shape = error_shape  # the served APIs' error shapes by path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            shape = self.error_shape(scope["path"])  # in the error shape of the API the body was sent to
            body = shape(413, too_large_message(self.max_bytes), "invalid_request_error", None, None)
            await JSONResponse(body, status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)
