"""The bench workload against a server, through the OpenAI client: an edgeinfer socket or any URL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, cast

import httpx
import openai

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
    client = async_client(socket_path, api_key).with_options(max_retries=0)
    return _guarded(str(socket_path), _run(client, "default", messages, max_tokens))


def run_url(
    url: str, model: str | None, messages: list[list[dict]], max_tokens: int, api_key: str | None = None
) -> RunResult:
    """The workload against any OpenAI-compatible endpoint (llama-server, Ollama, vLLM...)."""
    client = openai.AsyncOpenAI(base_url=url, api_key=api_key or "none", max_retries=0, timeout=600)
    return _guarded(url, _run(client, model or remote_model(url, api_key), messages, max_tokens))


def _guarded(where: str, run: Coroutine[Any, Any, RunResult]) -> RunResult:
    """Run a benchmark coroutine; the server's refusals become one-line errors."""
    try:
        return asyncio.run(run)
    except openai.APIConnectionError:
        raise EdgeInferError(f"lost the connection to {where} during the benchmark") from None
    except openai.APIStatusError as e:
        raise EdgeInferError(f"{where} refused a benchmark request ({e.status_code}): {e.message}") from None


def remote_model(url: str, api_key: str | None) -> str:
    """The first model the endpoint lists (GET /models)."""
    try:
        models = openai.OpenAI(base_url=url, api_key=api_key or "none", max_retries=0, timeout=30).models.list().data
    except openai.APIConnectionError:
        raise EdgeInferError(f"nothing answers at {url}; is the server running, and is the URL its /v1 root?") from None
    except openai.APIStatusError as e:
        raise EdgeInferError(f"{url} refused GET /models ({e.status_code}); pass --remote-model NAME") from None
    if not models:
        raise EdgeInferError(f"{url} lists no models; pass --remote-model NAME")
    return models[0].id


async def _run(client: openai.AsyncOpenAI, model: str, messages: list[list[dict]], max_tokens: int) -> RunResult:

    async def one(msgs: list[dict]) -> tuple[StreamResult, float, float]:
        t0 = time.perf_counter()
        first = last = 0.0
        usage = None
        stream = await client.chat.completions.create(
            model=model,
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
