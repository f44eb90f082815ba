"""Ready OpenAI and Anthropic clients bound to an edgeinfer Unix socket.

from edgeinfer.client import client
oai = client()                      # the default socket
oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}])

from edgeinfer.client import anthropic_client   # pip install 'edgeinfer[anthropic]'
claude = anthropic_client()
claude.messages.create(model="default", max_tokens=64, messages=[{"role": "user", "content": "hi"}])
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import openai

from edgeinfer.server.listen import default_socket_path

if TYPE_CHECKING:  # an optional extra: imported when a client is made
    import anthropic

BASE_URL = "http://edgeinfer/v1"  # the host name is ignored over a Unix socket
ANTHROPIC_BASE_URL = "http://edgeinfer"  # the anthropic SDK adds /v1/messages itself


def _path(socket_path: str | Path | None) -> str:
    return str(Path(socket_path).expanduser() if socket_path else default_socket_path())


def _key(api_key: str | None) -> str:
    return api_key or os.environ.get("EDGEINFER_API_KEY") or "none"


def _http(sdk: ModuleType = openai) -> ModuleType:
    """The HTTP library an SDK release is built on (httpx, or its successor httpx2): the package of the
    first class behind the SDK's DefaultHttpxClient that is not the SDK's own. Its transport is the one
    the SDK's client takes; the other library's is refused (anthropic 2.x runs on httpx2)."""
    own = sdk.__name__
    base = next(c for c in sdk.DefaultHttpxClient.__mro__ if c.__module__.split(".")[0] != own)
    return importlib.import_module(base.__module__.split(".")[0])


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


def _anthropic() -> ModuleType:
    try:
        return importlib.import_module("anthropic")
    except ImportError:
        raise ImportError("the anthropic client is an optional extra: pip install 'edgeinfer[anthropic]'") from None


def anthropic_client(
    socket_path: str | Path | None = None, api_key: str | None = None, timeout: float = 600.0
) -> anthropic.Anthropic:
    """An anthropic.Anthropic that talks to edgeinfer's Messages API over its Unix socket.

    The key (api_key, else $EDGEINFER_API_KEY) goes out as `x-api-key`, which `serve --api-key`
    accepts as it does a bearer token. anthropic 2.x is built on httpx2, not httpx: the Unix-socket
    transport is made from whichever library the installed SDK's client is built on.
    """
    sdk = _anthropic()
    transport = _http(sdk).HTTPTransport(uds=_path(socket_path))
    http_client = sdk.DefaultHttpxClient(transport=transport, timeout=timeout)
    return sdk.Anthropic(base_url=ANTHROPIC_BASE_URL, api_key=_key(api_key), http_client=http_client)


def async_anthropic_client(
    socket_path: str | Path | None = None, api_key: str | None = None, timeout: float = 600.0
) -> anthropic.AsyncAnthropic:
    """An anthropic.AsyncAnthropic that talks to edgeinfer's Messages API over its Unix socket."""
    sdk = _anthropic()
    transport = _http(sdk).AsyncHTTPTransport(uds=_path(socket_path))
    http_client = sdk.DefaultAsyncHttpxClient(transport=transport, timeout=timeout)
    return sdk.AsyncAnthropic(base_url=ANTHROPIC_BASE_URL, api_key=_key(api_key), http_client=http_client)
