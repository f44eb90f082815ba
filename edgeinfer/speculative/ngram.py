"""Prompt lookup: draft the tokens that followed the last occurrence of the current n-gram."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgeinfer.speculative.drafting import Draft, Offer, Pick

if TYPE_CHECKING:
    from edgeinfer.engine.stream import Stream

# How long a match backs a draft, in tokens of context equal before it: its acceptance is learned per
# bucket (lower bounds). A draft found after a long match is a copy going on: over the answers of
# scripts/ngram_backing.py (SmolLM2, greedy, five workloads) its first token was right at 0.51 of
# 2-token matches, 0.68 of 4, 0.77 of 5-6, 0.90 of 7-8 and 0.85-1.00 of longer ones (docs/speculation.md).
BACKING = (2, 3, 4, 5, 7, 9, 13, 17, 25, 32)


def backing_of(matched: int) -> int:
    """The BACKING bucket of a match of `matched` tokens (at least 2: the shortest n-gram looked up)."""
    return BACKING[bisect.bisect_right(BACKING, matched) - 1]


class NgramIndex:
    """Positions of n-grams in one stream's tokens, updated as tokens are appended.

    For each n in sizes, maps the n-gram ending at position i to i + 1 (where its
    continuation starts). The latest occurrence wins: recent context repeats most.
    """

    def __init__(self, sizes: tuple[int, ...] = (4, 3, 2)) -> None:
        self.sizes = sizes
        self.tables: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in sizes}
        self.tokens: list[int] = []

    def extend(self, tokens: list[int]) -> None:
        toks = self.tokens
        old = len(toks)
        toks.extend(tokens)
        end = len(toks)
        for n, table in self.tables.items():
            # The n-gram ending just before each new token, toks[i - n : i] -> i: its continuation is known. Built
            # with zips, in order so that the latest occurrence wins (a 1k-token prompt, under the engine's lock:
            # 0.33 ms, where a token at a time took 0.83).
            start = max(n, old)
            if start < end:
                grams = zip(*(toks[start - n + j : end - n + j] for j in range(n)), strict=True)
                table.update(zip(grams, range(start, end), strict=True))

    def draft(self, k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the longest matching recent n-gram, and how many tokens of context
        matched there (the n-gram's own n, extended backwards up to BACKING[-1]); ([], 0) if none."""
        toks = self.tokens
        for n in self.sizes:
            if len(toks) < n:
                continue
            start = self.tables[n].get(tuple(toks[-n:]))
            if start is not None and start < len(toks):
                matched = n
                while matched < BACKING[-1] and matched < start and toks[start - 1 - matched] == toks[-1 - matched]:
                    matched += 1
                return toks[start : start + k], matched
        return [], 0


class NgramDrafter:
    """Prompt lookup: each stream's own tokens, indexed; a draft is what followed the current n-gram before."""

    name = "ngram"
    runs_model = False

    def __init__(self) -> None:
        self._found: dict[int, list[int]] = {}  # by stream id: what available() found this step

    def prior(self, backing: int) -> float:
        # 1 - 1/m for a match of m tokens: 0.5 at 2, 0.75 at 4, 0.9 at 10, close to the rates measured (BACKING).
        return 0.5 if backing <= 0 else 1.0 - 1.0 / backing

    def attach(self, stream: Stream) -> NgramIndex:
        index = NgramIndex()
        index.extend(stream.tokens)
        return index

    def available(self, stream: Stream, room: int) -> Offer:
        assert stream.drafting is not None
        found, matched = stream.drafting.own.draft(room)
        self._found[stream.id] = found
        return Offer(len(found), backing_of(matched) if found else 0)

    def draft(self, picks: list[Pick], on_step: Callable[[int, float], None]) -> dict[int, Draft]:
        out = {p.stream.id: Draft(self._found[p.stream.id][: p.k], None) for p in picks}
        self._found.clear()
        return out

    def emitted(self, stream: Stream, tokens: list[int]) -> None:
        assert stream.drafting is not None
        stream.drafting.own.extend(tokens)

    def detach(self, stream: Stream) -> None:
        self._found.pop(stream.id, None)

    def close(self) -> None:
        pass
