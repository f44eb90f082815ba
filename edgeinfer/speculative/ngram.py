"""Prompt lookup: draft the tokens that followed the last occurrence of the current n-gram."""

from __future__ import annotations


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
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for n, table in self.tables.items():
                # Index the n-gram that ends just before the new token: its continuation is known.
                if end - 1 >= n:
                    table[tuple(self.tokens[end - 1 - n : end - 1])] = end - 1

    def draft(self, k: int) -> list[int]:
        """Up to k tokens that followed the longest matching recent n-gram; [] if none."""
        toks = self.tokens
        for n in self.sizes:
            if len(toks) < n:
                continue
            start = self.tables[n].get(tuple(toks[-n:]))
            if start is not None and start < len(toks):
                return toks[start : start + k]
        return []
