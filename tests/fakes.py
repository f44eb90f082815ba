"""Stand-ins the pure tests hand the chat layer in place of a loaded model."""

from __future__ import annotations

from collections.abc import Callable

from edgeinfer.engine.facts import ModelFacts
from edgeinfer.engine.template import ChatTemplate
from edgeinfer.options import EngineConfig


def fake_facts(template: ChatTemplate, special_token: Callable[[str], int | None] = lambda text: None) -> ModelFacts:
    """A model with this template, the default options, no recommended sampling and no special tags."""
    config = EngineConfig()
    return ModelFacts(
        template=template,
        special_token=special_token,
        n_vocab=49_152,
        n_ctx_stream=8_192,
        tool_format=config.tool_format,
        reasoning_format=config.reasoning_format,
        reasoning_budget=config.reasoning_budget,
    )
