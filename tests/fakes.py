"""Stand-ins the pure tests hand the chat layer in place of a loaded model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from edgeinfer.engine.facts import ModelFacts
from edgeinfer.engine.template import ChatTemplate
from edgeinfer.events import Chunk, Finish, StreamStats
from edgeinfer.options import EngineConfig


def fake_facts(template: ChatTemplate, special_token: Callable[[str], int | None] = lambda text: None) -> ModelFacts:
    """A model with this template, the default options, no recommended sampling and no special tags."""
    config = EngineConfig()
    return ModelFacts(
        template=template,
        special_token=special_token,
        tool_format=config.tool_format,
        reasoning_format=config.reasoning_format,
        reasoning_budget=config.reasoning_budget,
    )


class ScriptedHandle:
    """One stream of ScriptedEngine: its words as Chunks, then a Finish (what streaming.respond reads)."""

    def __init__(self, index: int, words: Sequence[str], prompt_tokens: int) -> None:
        self.index = index
        text = "".join(words)
        stats = StreamStats(prompt_tokens, 0, len(words), ttft_s=0.01, decode_tps=100.0, total_s=0.02)
        self.events = [Chunk(index, w, [i + 1], 0.0) for i, w in enumerate(words)]
        self.last = Finish(index, "stop", text, list(range(1, len(words) + 1)), stats)
        self.finish: Finish | None = None
        self.cancelled = False

    async def batches(self) -> AsyncIterator[list[Chunk | Finish]]:
        """Its events in the groups the engine hands them over in: the words of a step each, then the Finish."""
        for ev in self.events:
            yield [ev]
        self.finish = self.last
        yield [self.last]

    def cancel(self) -> None:
        self.cancelled = True


class ScriptedEngine:
    """A served model that answers every request with the same words (no model): enough of an Engine for the
    server's chat path (facts, template, tokens, the grammar check, submit)."""

    def __init__(self, words: Sequence[str] = ("Hello", " from", " the", " script.")) -> None:
        self.template = ChatTemplate(None)
        self.facts = fake_facts(self.template)
        self.words = words
        self.grammars = self
        self.prompts: list[list[int]] = []

    def chat_text(self, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
        return self.template.render(messages, tools=tools)

    def chat_tokens(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def compile(self, grammar: Any) -> str:
        return ""

    def submit(self, prompt: list[int], params: Any, n: int = 1, loop: Any = None) -> list[ScriptedHandle]:
        self.prompts.append(prompt)
        return [ScriptedHandle(i, self.words, len(prompt)) for i in range(n)]
