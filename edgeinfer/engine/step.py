"""What one step is made of: the batch items, the plan the scheduler makes, what each stream got.

Plain dataclasses shared by the scheduler (which makes plans), the engine (which runs them)
and the emitter and speculation (which read the outputs); the streams are engine/stream.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.engine.stream import Status, Stream


@dataclass(slots=True)
class BatchItem:
    """Tokens of one stream in the batch, and which streams sample from its last row."""

    stream: Stream
    tokens: list[int]
    pos0: int  # position of tokens[0]
    samplers: list[Stream]  # empty: no logits needed (a prompt chunk that is not the last)
    n_draft: int = 0  # trailing draft tokens: every position after tokens[0] needs logits
    row0: int = -1  # batch row of tokens[0], set when the batch is filled

    @property
    def draft(self) -> list[int]:
        return self.tokens[len(self.tokens) - self.n_draft :] if self.n_draft else []


@dataclass(slots=True)
class StepOutput:
    """What one stream got from a step."""

    stream: Stream
    tokens: list[int]  # new tokens to append: accepted drafts, then the sampled one
    n_rejected: int = 0  # computed positions to drop from the end (rejected drafts, or accepted ones after a stop)
    status: Status | None = None  # set when the stream ends with this step


@dataclass(slots=True)
class StepPlan:
    """Everything the engine does in one step."""

    items: list[BatchItem]
    finished: list[Stream]  # streams finished by cancellation since the last step

    @property
    def n_tokens(self) -> int:
        return sum(len(it.tokens) for it in self.items)
