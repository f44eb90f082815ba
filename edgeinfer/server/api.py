"""What an API the server speaks registers: its routes, and the shape its errors take under its paths.

Each API module (openai_chat.py, responses.py, messages.py, ...) ends with its `API = Api(...)`;
app.APIS lists them, and a server's app is built from such a list. Errors raised before a response
starts (validation, auth, engine refusals, an unknown path under the API's prefix) are answered by
the app's handlers in the shape of the API whose path prefix is the longest that matches, OpenAI's
elsewhere. A new dialect is one module with its router, its translation into the internal request,
its `streaming.Dialect`, and its `Api`, plus one line in app.APIS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import APIRouter

from edgeinfer.server.schema import error_body


class ErrorShape(Protocol):
    """An API's error body. type_ is OpenAI's vocabulary (invalid_request_error, authentication_error,
    server_error); a shape maps it, and the status, onto its own."""

    def __call__(
        self, status: int, message: str, type_: str, param: str | None, code: str | None
    ) -> dict[str, Any]: ...


def openai_shape(status: int, message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return error_body(message, type_, param, code)


@dataclass(frozen=True, slots=True)
class Api:
    name: str
    router: APIRouter
    paths: tuple[str, ...] = ()  # path prefixes whose errors take error_shape (none: OpenAI's shape applies)
    error_shape: ErrorShape = openai_shape


class ErrorShapes:
    """The error shape of a request path, from the APIs an app serves."""

    def __init__(self, apis: list[Api]) -> None:
        self.by_prefix = {p: api.error_shape for api in apis for p in api.paths}

    def __call__(self, path: str) -> ErrorShape:
        found = [p for p in self.by_prefix if path == p or path.startswith(p.rstrip("/") + "/")]
        return self.by_prefix[max(found, key=len)] if found else openai_shape
