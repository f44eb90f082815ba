"""A toy drafter, the whole of a new drafter in one module (tests/test_spec.py registers it).

It drafts the stream's last token again, k times: right only where the model repeats itself, so
its drafts are mostly refused, which verification must make harmless.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeinfer.speculative.drafting import Draft, Offer, Pick


class Echo:
    name = "echo"
    runs_model = False

    def prior(self, backing: int) -> float:
        return 0.3

    def attach(self, stream: Any) -> None:
        return None

    def available(self, stream: Any, room: int) -> Offer:
        return Offer(room)

    def draft(self, picks: list[Pick], on_step: Callable[[int, float], None]) -> dict[int, Draft]:
        return {p.stream.id: Draft([p.stream.tokens[-1]] * p.k, None) for p in picks}

    def emitted(self, stream: Any, tokens: list[int]) -> None:
        pass

    def detach(self, stream: Any) -> None:
        pass

    def close(self) -> None:
        pass


def echo_for(config: Any, target: Any, params: Any) -> Echo | None:
    """The factory: an engine that asks for n-gram drafts gets echoes instead (in the test that registers it)."""
    return Echo() if config.spec == "ngram" else None
