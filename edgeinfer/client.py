"""Ready OpenAI clients bound to an edgeinfer Unix socket.

from edgeinfer.client import client
oai = client()                      # the default socket
oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import openai

from edgeinfer.server.listen import default_socket_path

BASE_URL = "http://edgeinfer/v1"  # the host name is ignored over a Unix socket


def _path(socket_path: str | Path | None) -> str:
    return str(Path(socket_path).expanduser() if socket_path else default_socket_path())


def _key(api_key: str | None) -> str:
    return api_key or os.environ.get("EDGEINFER_API_KEY") or "none"


def _http() -> ModuleType:
    """The HTTP library this openai release is built on (httpx, or its successor httpx2)."""
    return importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])


def client(socket_path: str | Path | None = None, api_key: str | None = None, timeout: float = 600.0) -> openai.OpenAI:
    """An openai.OpenAI that talks to edgeinfer over its Unix socket."""
    transport = _http().HTTPTransport(uds=_path(socket_path))
    http_client = openai.DefaultHttpxClient(transport=transport, timeout=timeout)
    return openai.OpenAI(base_url=BASE_URL, api_key=_key(api_key), http_client=http_client)


def async_client(
    socket_path: str | Path | None = None, api_key: str | None = None, timeout: float = 600.0
) -> openai.AsyncOpenAI:
    """An openai.AsyncOpenAI that talks to edgeinfer over its Unix socket."""
    transport = _http().AsyncHTTPTransport(uds=_path(socket_path))
    http_client = openai.DefaultAsyncHttpxClient(transport=transport, timeout=timeout)
    return openai.AsyncOpenAI(base_url=BASE_URL, api_key=_key(api_key), http_client=http_client)
