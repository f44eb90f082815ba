"""The `edgeinfer chat` loop: streaming replies, Ctrl-C stops a reply, not the program.

A reasoning model's thinking is shown dimmed before its answer (/think hides or shows it) and is not kept
in the conversation: the next turn's prompt holds the answers only, as reasoning templates expect."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import click
import platformdirs

from edgeinfer.events import Chunk, Finish, StreamStats
from edgeinfer.formats import reasoning
from edgeinfer.options import SamplingParams
from edgeinfer.prepare import prepare
from edgeinfer.request import ChatInput, Role, Turn

HELP = """commands:
  /reset   forget the conversation
  /think   hide or show the model's thinking (models that reason)
  /exit    leave (Ctrl-D works too)
  /help    this text
Ctrl-C stops the reply being written."""


@dataclass(slots=True)
class Thought:
    """New thinking text of the reply (a reasoning model's), apart from its answer."""

    text: str


Reply = Iterator[Chunk | Thought | Finish]  # a reply's events; its Finish's text is the answer alone


class ChatBackend(Protocol):
    """Where replies come from: the in-process engine or a server on a socket."""

    def reply(self, messages: list[dict[str, str]], params: SamplingParams) -> Reply: ...
    def cancel(self) -> None: ...
    def reset(self) -> None: ...


class EngineBackend:
    """Chat against an in-process Engine; the KV of earlier turns is reused by prefix."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._handle: Any = None

    def reply(self, messages: list[dict[str, str]], params: SamplingParams) -> Reply:
        engine = self.engine
        # The server's own path (edgeinfer.prepare): the template, the thinking bounded by --reasoning-budget and
        # split by --reasoning-format, a base model's turn ended. The flags' sampling is kept whole (all named).
        turns = [Turn(cast(Role, m["role"]), m["content"]) for m in messages]
        req = ChatInput("chat", turns, params, named=frozenset(SamplingParams.model_fields))
        prompt, params, shape = prepare(engine, req)
        split = reasoning.ReasoningSplit(shape.thinking, shape.started) if shape.thinking is not None else None
        self._handle = engine.submit(prompt, params)[0]
        if split is None:
            yield from self._handle
            return
        for ev in self._handle:
            if isinstance(ev, Chunk):
                thought, answer = split.feed(ev.text)
                if thought:
                    yield Thought(thought)
                yield dataclasses.replace(ev, text=answer)
            else:
                thought, answer = split.end()
                if thought:
                    yield Thought(thought)
                if answer:
                    yield Chunk(ev.index, answer, [], ev.t)
                yield dataclasses.replace(ev, text=reasoning.split(ev.text, split.thinking, split.started)[1])

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def reset(self) -> None:
        self.engine.reset_prefixes()


class SocketBackend:
    """Chat against a running `edgeinfer serve`, through the OpenAI client on its socket."""

    def __init__(self, socket_path: str, api_key: str | None) -> None:
        from edgeinfer.client import client

        self._client = client(socket_path, api_key)
        self._stream: Any = None

    def reply(self, messages: list[dict[str, str]], params: SamplingParams) -> Reply:
        import openai

        from edgeinfer.errors import EdgeInferError

        try:
            self._stream = self._client.chat.completions.create(
                model="default",
                messages=cast(Any, messages),
                temperature=params.temperature,
                max_tokens=params.max_tokens,
                seed=params.seed,
                stream=True,
                stream_options={"include_usage": True},
            )
        except openai.APIConnectionError:
            raise EdgeInferError(
                f"no edgeinfer server answers on {self._client.base_url} socket; start `edgeinfer serve`"
            ) from None
        except openai.APIStatusError as e:
            raise EdgeInferError(f"the server refused the request: {e.message}") from None
        text, reason = "", "stop"
        for chunk in self._stream:
            for choice in chunk.choices:
                if thought := getattr(choice.delta, "reasoning_content", None):
                    yield Thought(thought)
                if choice.delta.content:
                    text += choice.delta.content
                    yield Chunk(0, choice.delta.content, [], 0.0)
                if choice.finish_reason:
                    reason = choice.finish_reason
            if chunk.usage is not None:
                t = (chunk.model_extra or {}).get("timings", {})
                cached = t.get("cached_tokens", 0)
                stats = StreamStats(
                    prompt_tokens=chunk.usage.prompt_tokens,
                    cached_tokens=cached,
                    completion_tokens=chunk.usage.completion_tokens,
                    ttft_s=(t.get("ttft_s") or [None])[0],
                    decode_tps=(t.get("decode_tps") or [None])[0],
                    total_s=0.0,
                )
                yield Finish(0, reason, text, [], stats)

    def cancel(self) -> None:
        if self._stream is not None:
            self._stream.close()  # closing the connection cancels the stream on the server

    def reset(self) -> None:
        pass  # the server keeps prefixes by its own LRU policy


def stats_line(stats: StreamStats) -> str:
    parts = [f"{stats.completion_tokens} tokens"]
    if stats.decode_tps:
        parts.append(f"{stats.decode_tps:.1f} tok/s")
    if stats.ttft_s is not None:
        parts.append(f"TTFT {stats.ttft_s * 1000:.0f} ms")
    if stats.cached_tokens:
        parts.append(f"{stats.cached_tokens}/{stats.prompt_tokens} prompt tokens reused")
    return " · ".join(parts)


def history_path() -> Path:
    """Where `edgeinfer chat` keeps the last conversation, for `--resume`."""
    return platformdirs.user_data_path("edgeinfer") / "last-chat.json"


def load_history(path: Path) -> list[dict[str, str]]:
    """The saved conversation; EdgeInferError naming the file when there is none or it is unreadable."""
    from edgeinfer.errors import EdgeInferError

    try:
        messages = json.loads(path.read_text())
    except FileNotFoundError:
        raise EdgeInferError(
            f"no conversation to resume ({path} does not exist); start one with `edgeinfer chat`"
        ) from None
    except (OSError, ValueError) as e:
        raise EdgeInferError(f"cannot read the saved conversation {path} ({e}); delete it to start afresh") from None
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise EdgeInferError(f"{path} is not a saved conversation; delete it to start afresh")
    return messages


def save_history(path: Path, messages: list[dict[str, str]]) -> None:
    """Write the conversation atomically (a crash mid-write leaves the previous one)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(messages, ensure_ascii=False, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # resuming is a convenience: a read-only home must not stop the chat


def chat_loop(
    backend: ChatBackend,
    system: str | None,
    params: SamplingParams,
    history: list[dict[str, str]] | None = None,
    save_to: Path | None = None,
    show_thinking: bool = True,
) -> None:
    """The REPL; with `history` it continues that conversation, with `save_to` it keeps it there after each reply.
    show_thinking: a reasoning model's thinking is shown (dimmed), else one line says it is thinking."""
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    if history:
        messages = history
        turns = sum(m["role"] == "user" for m in history)
        click.echo(click.style(f"resumed a conversation of {turns} turns; /reset starts a new one", dim=True))
    click.echo(click.style("type a message; /help for commands", dim=True))
    prompt = click.style("> ", fg="green", bold=True) if sys.stdout.isatty() else "> "
    while True:
        try:
            line = input(prompt)
        except EOFError:
            click.echo()
            return
        except KeyboardInterrupt:
            click.echo(click.style("\n(/exit or Ctrl-D to leave)", dim=True))
            continue
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            return
        if cmd == "/help":
            click.echo(HELP)
            continue
        if cmd == "/think":
            show_thinking = not show_thinking
            click.echo(click.style(f"thinking {'shown' if show_thinking else 'hidden'}", dim=True))
            continue
        if cmd == "/reset":
            messages = messages[:1] if system else []
            backend.reset()
            click.echo(click.style("conversation cleared", dim=True))
            continue
        if cmd.startswith("/"):
            click.echo(f"unknown command {cmd}; /help lists them")
            continue
        messages.append({"role": "user", "content": line})
        finish = _stream_reply(backend, messages, params, show_thinking)
        if finish is None or finish.finish_reason == "error":
            messages.pop()
            if finish is not None:
                click.echo(click.style(f"error: {finish.error}", fg="red"))
            continue
        messages.append({"role": "assistant", "content": finish.text})
        if save_to is not None:
            save_history(save_to, messages)
        note = " · stopped" if finish.finish_reason == "cancelled" else ""
        click.echo(click.style(stats_line(finish.stats) + note, dim=True))


def _stream_reply(
    backend: ChatBackend, messages: list[dict[str, str]], params: SamplingParams, show_thinking: bool = True
) -> Finish | None:
    finish: Finish | None = None
    events = backend.reply(messages, params)
    thinking = False  # thinking shown, and no answer yet: the answer starts on a line of its own
    try:
        for ev in events:
            if isinstance(ev, Thought):
                if not thinking:
                    click.echo(click.style("thinking: " if show_thinking else "thinking...", dim=True), nl=False)
                    thinking = True
                if show_thinking:
                    click.echo(click.style(ev.text, dim=True), nl=False)
            elif isinstance(ev, Chunk):
                if thinking and ev.text:
                    click.echo("\n" if show_thinking else " ", nl=False)
                    thinking = False
                click.echo(ev.text, nl=False)
            else:
                finish = ev
    except KeyboardInterrupt:
        backend.cancel()
        # Drain to the Finish so the stream's figures (and KV) are settled.
        with contextlib.suppress(KeyboardInterrupt):
            for ev in events:
                if isinstance(ev, Finish):
                    finish = ev
    click.echo()
    return finish
