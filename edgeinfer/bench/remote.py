"""The bench workload against a server over its socket, through the OpenAI client."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import httpx

from edgeinfer.bench.stats import RunResult, StreamResult
from edgeinfer.client import async_client
from edgeinfer.errors import EdgeInferError


def server_info(socket_path: Path, api_key: str | None) -> dict:
    """The server's /v1/edgeinfer/stats snapshot (model, context, parallel)."""
    transport = httpx.HTTPTransport(uds=str(socket_path))
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(transport=transport, base_url="http://edgeinfer", timeout=30) as http:
            r = http.get("/v1/edgeinfer/stats", headers=headers)
    except httpx.TransportError:
        raise EdgeInferError(f"no edgeinfer server answers on {socket_path}; start `edgeinfer serve`") from None
    if r.status_code != 200:
        raise EdgeInferError(f"the server at {socket_path} answered {r.status_code}: {r.text[:200]}")
    return r.json()


def run_socket(socket_path: Path, messages: list[list[dict]], max_tokens: int, api_key: str | None = None) -> RunResult:
    return asyncio.run(_run(socket_path, messages, max_tokens, api_key))


async def _run(socket_path: Path, messages: list[list[dict]], max_tokens: int, api_key: str | None) -> RunResult:
    client = async_client(socket_path, api_key).with_options(max_retries=0)

    async def one(msgs: list[dict]) -> tuple[StreamResult, float, float]:
        t0 = time.perf_counter()
        first = last = 0.0
        usage = None
        stream = await client.chat.completions.create(
            model="default",
            messages=cast(Any, msgs),
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or now
                last = now
            usage = chunk.usage or usage
        n = usage.completion_tokens if usage else 0
        tps = (n - 1) / (last - first) if n > 1 and last > first else None
        return StreamResult(usage.prompt_tokens if usage else 0, n, first - t0 if first else None, tps), first, last

    t_start = time.perf_counter()
    results = await asyncio.gather(*(one(m) for m in messages))
    t_end = time.perf_counter()
    await client.close()
    return RunResult([r for r, _, _ in results], t_start, max(f for _, f, _ in results), t_end)
