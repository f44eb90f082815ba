"""Where drafts come from (the Drafter protocol and its registry), and one stream's speculation state.

A drafter proposes tokens for the streams the speculator picks; the speculator decides how many
each gets (the cost model), verifies them losslessly and keeps the counts. The built-in drafters
are prompt lookup over the stream's own tokens (`ngram.py`) and a draft model (`draft.py`); a new
one is a class in a module of its own and its `register_drafter` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from edgeinfer.speculative.control import Acceptance

if TYPE_CHECKING:
    from edgeinfer.engine.stream import Stream
    from edgeinfer.llamacpp import ContextParams, Model
    from edgeinfer.options import EngineConfig


@dataclass(slots=True)
class Drafting:
    """What the speculator keeps of one stream between steps."""

    own: Any  # the drafter's state for this stream (attach's), e.g. its tokens indexed by n-gram
    accept: Acceptance  # the stream's own rate (drafts a drafter cannot say more of, Offer.backing 0)
    rng: np.random.Generator  # rejection sampling's draws (--spec-verify rejection)
    backing: int = 0  # the pending draft's Offer.backing
    q: np.ndarray | None = None  # laws the pending draft was drawn from (rejection sampling only)


@dataclass(slots=True)
class Draft:
    tokens: list[int]
    q: np.ndarray | None  # (len(tokens), vocab) laws the tokens were drawn from; None unless drawn


@dataclass(frozen=True, slots=True)
class Offer:
    """What a drafter can draft for one stream this step."""

    n: int  # tokens, at most the room asked for; 0: none
    # What the draft's acceptance is learned by, across streams: an n-gram draft's matched context (its bucket of
    # ngram.BACKING), where a long match is a copy going on. 0: the stream's own rate.
    backing: int = 0


@dataclass(slots=True)
class Pick:
    """One stream the speculator drafts for this step, and how many tokens at most."""

    stream: Stream
    k: int
    rng: np.random.Generator | None  # given: draw each draft from the drafter's law q (rejection sampling)


class Drafter(Protocol):
    """A source of drafts for the speculator."""

    name: str  # what the stats call it (SpeculationStats.source)
    runs_model: bool  # drafting decodes a model: the cost model weighs those decodes

    def prior(self, backing: int) -> float:
        """The acceptance rate expected of its drafts offered with this backing, before any is measured."""
        ...

    def attach(self, stream: Stream) -> Any:
        """A new stream may draft: its state, kept on stream.drafting.own."""
        ...

    def available(self, stream: Stream, room: int) -> Offer:
        """How many tokens (at most room) it can draft for the stream now, and what backs them."""
        ...

    def draft(self, picks: list[Pick], on_step: Callable[[int, float], None]) -> dict[int, Draft]:
        """The drafts of the picked streams, by stream id; on_step(n_streams, seconds) reports each model decode."""
        ...

    def emitted(self, stream: Stream, tokens: list[int]) -> None:
        """The stream's new tokens (accepted drafts and the one after)."""
        ...

    def detach(self, stream: Stream) -> None:
        """The stream has ended."""
        ...

    def close(self) -> None: ...


# Makes the drafter a configuration asks for, or None when it asks for another (speculator.make_drafter asks
# the registered ones first, newest first, then the built-in ones).
DrafterFactory = Callable[["EngineConfig", "Model", "ContextParams"], "Drafter | None"]
DRAFTERS: list[DrafterFactory] = []


def register_drafter(factory: DrafterFactory) -> DrafterFactory:
    """Add a drafter (a class in a module of its own, and a factory that says when a configuration wants it)."""
    DRAFTERS.insert(0, factory)
    return factory
