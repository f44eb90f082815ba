"""ModelFacts: what the server and `edgeinfer chat` read of a loaded model, apart from running it.

The chat layer (the templates, the tool-call formats, the answer's reading) asks these, never the
engine's attributes: a test can hand it facts of its own, and the engine can change inside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.engine.template import ChatTemplate

BASE_MODEL_TOKENS = 512  # where a base model's chat turn ends (it has no chat template to end one)


@dataclass(frozen=True, slots=True)
class ModelFacts:
    template: ChatTemplate  # the model's chat template, or a layout from its vocabulary (template.fallback)
    special_token: Callable[[str], int | None]  # the token a text is as one special token of the vocabulary
    tool_format: str  # --tool-format: "auto" (from the template) or a family's name
    reasoning_format: str  # --reasoning-format
    reasoning_budget: int  # --reasoning-budget (-1: unbounded)
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # what the GGUF recommends (general.sampling.*)

    @property
    def turn_limit(self) -> int | None:
        """Where the server ends a chat turn the model cannot end itself: a base model's (no chat template)."""
        return BASE_MODEL_TOKENS if self.template.fallback else None
