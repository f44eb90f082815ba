"""The request and stream shapes bench drives a server with, besides chat completions: OpenAI's Responses and
Anthropic's Messages, streamed over plain HTTP (a socket or a URL), so that any server speaking them can be measured.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from edgeinfer.bench.results import RunResult, StreamResult
from edgeinfer.errors import ConfigError, EdgeInferError

APIS = ("chat", "responses", "messages")


def parse_apis(text: str) -> list[str]:
    """--api: one of APIS, or several comma-separated (measured side by side)."""
    apis = [a.strip() for a in text.split(",") if a.strip()]
    bad = [a for a in apis if a not in APIS]
    if bad or not apis or len(set(apis)) != len(apis):
        raise ConfigError(f"--api {text!r}: use one or more of {', '.join(APIS)}, comma-separated, each once")
    return apis


def _split(msgs: list[dict[str, str]]) -> tuple[str, list[dict[str, str]]]:
    """The system text, and the other turns."""
    system = "\n\n".join(m["content"] for m in msgs if m["role"] == "system")
    return system, [{"role": m["role"], "content": m["content"]} for m in msgs if m["role"] != "system"]


def responses_body(model: str, msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    system, turns = _split(msgs)
    body: dict[str, Any] = {"model": model, "input": turns, "max_output_tokens": max_tokens, "stream": True}
    if system:
        body["instructions"] = system
    # Greedy and exactly max_tokens (ignore_eos: edgeinfer's and llama-server's extension), as for chat.
    return body | {"temperature": 0.0, "ignore_eos": True, "store": False}


def messages_body(model: str, msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    system, turns = _split(msgs)
    body: dict[str, Any] = {"model": model, "messages": turns, "max_tokens": max_tokens, "stream": True}
    if system:
        body["system"] = system
    return body | {"temperature": 0.0, "ignore_eos": True}


async def _sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON data of each server-sent event."""
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                yield json.loads(data)


async def _responses_stream(http: httpx.AsyncClient, model: str, msgs: Any, max_tokens: int) -> StreamResult:
    t0 = time.perf_counter()
    arrivals: list[float] = []
    usage: dict[str, Any] = {}
    async with http.stream("POST", "responses", json=responses_body(model, msgs, max_tokens)) as r:
        await _ok(r)
        async for ev in _sse(r):
            kind = ev.get("type")
            if kind == "response.output_text.delta" and ev.get("delta"):
                arrivals.append(time.perf_counter() - t0)
            elif kind in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens reached
                usage = ev["response"].get("usage") or {}
            elif kind in ("response.failed", "error"):
                raise EdgeInferError(f"a benchmark stream failed: {json.dumps(ev)[:300]}")
    return _result(usage.get("input_tokens"), usage.get("output_tokens"), arrivals)


async def _messages_stream(http: httpx.AsyncClient, model: str, msgs: Any, max_tokens: int) -> StreamResult:
    t0 = time.perf_counter()
    arrivals: list[float] = []
    prompt, completion = None, None
    async with http.stream("POST", "messages", json=messages_body(model, msgs, max_tokens)) as r:
        await _ok(r)
        async for ev in _sse(r):
            kind = ev.get("type")
            if kind == "content_block_delta" and ev["delta"].get("type") == "text_delta" and ev["delta"].get("text"):
                arrivals.append(time.perf_counter() - t0)
            elif kind == "message_start":
                prompt = ev["message"]["usage"].get("input_tokens")
            elif kind == "message_delta":
                completion = (ev.get("usage") or {}).get("output_tokens", completion)
            elif kind == "error":
                raise EdgeInferError(f"a benchmark stream failed: {json.dumps(ev)[:300]}")
    return _result(prompt, completion, arrivals)


def _result(prompt: int | None, completion: int | None, arrivals: list[float]) -> StreamResult:
    n = completion if completion is not None else len(arrivals)
    return StreamResult(prompt or 0, n, arrivals[0] if arrivals else None, arrivals)


async def _ok(r: httpx.Response) -> None:
    if r.status_code != 200:
        text = (await r.aread()).decode("utf-8", "replace")[:300]
        raise EdgeInferError(f"{r.request.url} refused a benchmark request ({r.status_code}): {text}")


def client(api: str, socket: Path | None, url: str | None, api_key: str | None) -> httpx.AsyncClient:
    """An HTTP client whose base is the server's /v1 root, with the API's own key header."""
    headers = {}
    if api == "messages":
        headers["anthropic-version"] = "2023-06-01"
        if api_key:
            headers["x-api-key"] = api_key
    elif api_key:
        headers["authorization"] = f"Bearer {api_key}"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    if socket is not None:
        transport = httpx.AsyncHTTPTransport(uds=str(socket), limits=limits)
        return httpx.AsyncClient(transport=transport, base_url="http://edgeinfer/v1", headers=headers, timeout=600)
    assert url is not None
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits)


async def run_streams(
    api: str, http: httpx.AsyncClient, model: str, messages: list[Any], max_tokens: int, done: Callable[[], None]
) -> RunResult:
    """Every conversation at once as a streamed Responses or Messages request."""
    one_stream = _responses_stream if api == "responses" else _messages_stream

    async def one(msgs: Any) -> StreamResult:
        result = await one_stream(http, model, msgs, max_tokens)
        done()
        return result

    t_start = time.perf_counter()
    try:
        streams = await asyncio.gather(*(one(m) for m in messages))
    except httpx.TransportError as e:
        raise EdgeInferError(f"lost the connection during the benchmark ({e!r})") from None
    finally:
        await http.aclose()
    return RunResult(list(streams), t_start, time.perf_counter())
