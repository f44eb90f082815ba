"""Ready OpenAI clients bound to an edgeinfer Unix socket.

from edgeinfer.client import client
oai = client()                      # the default socket
oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import openai

from edgeinfer.server.run import default_socket_path

BASE_URL = "http://edgeinfer/v1"  # the host name is ignored over a Unix socket


def _path(socket_path: str | Path | None) -> str:
    return str(Path(socket_path).expanduser() if socket_path else default_socket_path())


def _key(api_key: str | None) -> str:
    return api_key or os.environ.get("EDGEINFER_API_KEY") or "none"


def client(socket_path: str | Path | None = None, api_key: str | None = None, timeout: float = 600.0) -> openai.OpenAI:
    transport = httpx.HTTPTransport(uds=_path(socket_path))
    return openai.OpenAI(
        base_url=BASE_URL, api_key=_key(api_key), http_client=httpx.Client(transport=transport, timeout=timeout)
    )


def async_client(
    socket_path: str | Path | None = None, api_key: str | None = None, timeout: float = 600.0
) -> openai.AsyncOpenAI:
    transport = httpx.AsyncHTTPTransport(uds=_path(socket_path))
    return openai.AsyncOpenAI(
        base_url=BASE_URL, api_key=_key(api_key), http_client=httpx.AsyncClient(transport=transport, timeout=timeout)
    )
