"""What the benchmark measures. Every target takes the same chat messages and returns a RunResult.

- EngineTarget: an in-process engine (optionally with speculation forced on or off);
- RawTarget: the bare llama_decode loop on that engine's own context (the overhead baseline);
- ServerTarget: any OpenAI-compatible server, by Unix socket or URL (edgeinfer serve,
  llama-server, Ollama, vLLM), through the openai client with streaming; or through the
  Responses or Messages API (edgeinfer.bench.apis).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx
import openai

from edgeinfer.bench import apis
from edgeinfer.bench.exclusive import run_exclusive, set_speculation
from edgeinfer.bench.results import RunResult, StreamResult
from edgeinfer.engine.stats import EngineStats
from edgeinfer.errors import EdgeInferError
from edgeinfer.events import Chunk, Finish
from edgeinfer.options import SamplingParams

Messages = list[list[dict[str, str]]]
R = TypeVar("R")
Done = Callable[[], None]  # called once per finished stream (the progress bar)


class Target:
    """One side of a benchmark."""

    name: str
    kind: str  # engine | raw | socket | url

    def run(self, messages: Messages, max_tokens: int, done: Done) -> RunResult:
        """Send every conversation at once; greedy, exactly max_tokens each (end-of-text ignored)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """What the JSON report says about this target: model and settings where known."""
        return {}


class EngineTarget(Target):
    kind = "engine"

    def __init__(self, engine: Any, name: str = "edgeinfer", speculate: bool | None = None) -> None:
        self.engine = engine
        self.name = name
        self.speculate = speculate  # True/False: turn the engine's speculation on/off for this target's runs

    def run(self, messages: Messages, max_tokens: int, done: Done) -> RunResult:
        if self.speculate is not None:
            set_speculation(self.engine, self.speculate)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        prompts = [self.engine.chat_prompt(m) for m in messages]
        t_start = time.perf_counter()
        handles = [self.engine.submit(p, params)[0] for p in prompts]
        streams = []
        for h in handles:
            streams.append(_engine_stream(h.collect()))
            done()
        return RunResult(streams, t_start, time.perf_counter())

    def describe(self) -> dict[str, Any]:
        e = self.engine
        return {
            "model": str(e.model_path),
            "config": {
                "parallel": e.config.parallel,
                "ctx_size": e.n_ctx,
                "batch_size": e.config.batch_size,
                "threads": e.ctx.threads,
                "gpu_layers": e.config.gpu_layers,
                "kv_type": e.config.kv_type,
                "flash_attn": e.config.flash_attn,
                "spec": e.config.spec if self.speculate is not False else "off",
            },
        }


def _engine_stream(events: list[Chunk | Finish]) -> StreamResult:
    finish = events[-1]
    assert isinstance(finish, Finish)
    if finish.finish_reason == "error":
        raise EdgeInferError(f"a benchmark stream failed: {finish.error}")
    st = finish.stats
    arrivals = [ev.t for ev in events if isinstance(ev, Chunk) and ev.token_ids]
    return StreamResult(st.prompt_tokens, st.completion_tokens, st.ttft_s, arrivals, st.draft_tokens, st.draft_accepted)


class RawTarget(Target):
    """The raw loop: no scheduler, no prefix cache; it runs on the engine's thread and context."""

    kind = "raw"
    name = "raw loop"

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def run(self, messages: Messages, max_tokens: int, done: Done) -> RunResult:
        from edgeinfer.bench.rawloop import run_raw

        prompts = [self.engine.chat_prompt(m) for m in messages]
        result = run_exclusive(self.engine, lambda ctx: run_raw(ctx, prompts, max_tokens))
        for _ in prompts:
            done()
        return cast(RunResult, result)


class ServerTarget(Target):
    """An OpenAI-compatible server by Unix socket (`socket`) or base URL (`url`)."""

    def __init__(
        self,
        *,
        socket: Path | None = None,
        url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        name: str | None = None,
        api: str = "chat",
    ) -> None:
        if (socket is None) == (url is None):
            raise ValueError("give a socket or a URL")
        self.socket, self.url, self.api_key = socket, url, api_key
        self.api = api  # chat | responses | messages (edgeinfer.bench.apis)
        self.kind = "socket" if socket else "url"
        self.where = str(socket or url)
        self.name = name or (self.where if api == "chat" else f"{self.where} ({api})")
        self.model = model or self._first_model()

    def client(self, timeout: float = 600) -> openai.AsyncOpenAI:
        key = self.api_key or "none"
        if self.socket is not None:
            from edgeinfer.client import async_client

            return async_client(self.socket, self.api_key).with_options(max_retries=0, timeout=timeout)
        return openai.AsyncOpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=timeout)

    def _first_model(self) -> str:
        async def ask() -> str:
            client = self.client(timeout=30)
            try:
                data = (await client.models.list()).data
            finally:
                await client.close()
            if not data:
                raise EdgeInferError(f"{self.where} lists no models; pass --remote-model NAME")
            return data[0].id

        try:
            return asyncio.run(ask())
        except openai.APIConnectionError:
            raise EdgeInferError(
                f"nothing answers at {self.where}; is the server running"
                + ("?" if self.socket else ", and is the URL its /v1 root?")
            ) from None
        except openai.APIStatusError as e:
            raise EdgeInferError(
                f"{self.where} refused GET /models ({e.status_code}); pass --remote-model NAME"
            ) from None

    def run(self, messages: Messages, max_tokens: int, done: Done) -> RunResult:
        if self.api != "chat":
            http = apis.client(self.api, self.socket, self.url, self.api_key)
            return self.guarded(apis.run_streams(self.api, http, self.model, messages, max_tokens, done))
        return self.guarded(_run_streams(self.client(), self.model, messages, max_tokens, done))

    def guarded(self, run: Coroutine[Any, Any, R]) -> R:
        """Run a benchmark coroutine; the server's refusals become one-line errors."""
        try:
            return asyncio.run(run)
        except openai.APIConnectionError:
            raise EdgeInferError(f"lost the connection to {self.where} during the benchmark") from None
        except openai.APIStatusError as e:
            raise EdgeInferError(f"{self.where} refused a benchmark request ({e.status_code}): {e.message}") from None

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "where": self.where}

    def edgeinfer_info(self) -> EngineStats | None:
        """The /v1/edgeinfer/stats snapshot when this is an edgeinfer socket (model path and settings)."""
        if self.socket is None:
            return None
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        transport = httpx.HTTPTransport(uds=str(self.socket))
        try:
            with httpx.Client(transport=transport, base_url="http://edgeinfer", timeout=30) as http:
                r = http.get("/v1/edgeinfer/stats", headers=headers)
        except httpx.TransportError:
            return None
        return EngineStats.model_validate_json(r.content) if r.status_code == 200 else None


async def _run_streams(
    client: openai.AsyncOpenAI, model: str, messages: Messages, max_tokens: int, done: Done
) -> RunResult:

    async def one(msgs: list[dict[str, str]]) -> StreamResult:
        t0 = time.perf_counter()
        arrivals: list[float] = []
        usage = None
        timings: dict[str, Any] = {}
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
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.perf_counter() - t0)
            usage = chunk.usage or usage
            timings = (chunk.model_extra or {}).get("timings") or timings  # llama-server and edgeinfer send these
        done()
        n = usage.completion_tokens if usage else len(arrivals)
        return StreamResult(
            usage.prompt_tokens if usage else 0,
            n,
            arrivals[0] if arrivals else None,
            arrivals,
            int(timings.get("draft_n") or 0),
            int(timings.get("draft_n_accepted") or 0),
        )

    t_start = time.perf_counter()
    try:
        streams = await asyncio.gather(*(one(m) for m in messages))
    finally:
        await client.close()
    return RunResult(list(streams), t_start, time.perf_counter())


# --- tool-call validity (the agent workload) ---------------------------------------------


def calls_validate(calls: list[tuple[str, str]], schemas: dict[str, Any]) -> bool:
    """Whether a reply is tool calls, each naming a known tool, with JSON arguments its schema validates."""
    import jsonschema

    try:
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), schemas[name])
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False
    return bool(calls)


def tool_replies(target: Target, messages: Messages, tools: list[dict[str, Any]], max_tokens: int) -> list[Any]:
    """Each conversation's reply with `tools` and tool_choice "required" (greedy): (text, tool calls as
    (name, arguments JSON text)); None where the target cannot be asked (the raw loop)."""
    if isinstance(target, EngineTarget):
        return [_engine_tool_reply(target.engine, m, tools, max_tokens) for m in messages]
    if isinstance(target, ServerTarget) and target.api == "chat":  # the other APIs are measured for speed only
        return target.guarded(_server_tool_replies(target, messages, tools, max_tokens))
    return [None] * len(messages)


def _engine_tool_reply(engine: Any, msgs: Any, tools: list[dict[str, Any]], max_tokens: int) -> Any:
    from edgeinfer.events import Chunk, Finish
    from edgeinfer.prepare import prepare
    from edgeinfer.server.output import ToolCall, whole
    from edgeinfer.server.schema import ChatRequest

    req = ChatRequest(
        model="x", messages=msgs, tools=tools, tool_choice="required", temperature=0, max_tokens=max_tokens
    )
    prompt, params, shape = prepare(engine, req.to_input())  # the prompt, grammar and format the server would use
    *chunks, finish = engine.submit(prompt, params)[0].collect()
    assert isinstance(finish, Finish)
    events = whole([c for c in chunks if isinstance(c, Chunk)], finish, shape)
    return finish.text, [(ev.name, ev.arguments) for ev in events if isinstance(ev, ToolCall)]


async def _server_tool_replies(
    target: ServerTarget, messages: Messages, tools: list[dict[str, Any]], max_tokens: int
) -> list[Any]:
    client = target.client()

    async def one(msgs: Any) -> Any:
        r = await client.chat.completions.create(
            model=target.model,
            messages=msgs,
            tools=cast(Any, tools),
            tool_choice="required",
            temperature=0.0,
            max_tokens=max_tokens,
        )
        m = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or [] if c.type == "function"]
        return m.content or "", calls

    try:
        return list(await asyncio.gather(*(one(m) for m in messages)))
    finally:
        await client.close()
