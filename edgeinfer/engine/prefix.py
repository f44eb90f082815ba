"""Prefix matching: which held KV shares the longest prefix with a prompt.

Every held token list is indexed by a chained hash of each prefix of whole BLOCK-token blocks
(the hash of block i covers the tokens before it too), as vLLM's prefix cache keys its blocks.
A lookup walks the prompt's chain while some key holds it, then finds the exact length among
those keys within the next block, and checks the matched tokens themselves, so a hash collision
costs a slower lookup, never a wrong answer. Inserting a 1,000-token prompt hashes 62 blocks;
the token-per-node trie this replaces made 1,000 nodes in Python (1.2 ms a request on the engine
thread, before the request's first decode).
"""

from __future__ import annotations

BLOCK = 16  # tokens a hash covers


class PrefixIndex:
    """Maps keys (sequence, stream or entry ids) to token lists; finds the longest shared prefix."""

    def __init__(self) -> None:
        self._tokens: dict[int, list[int]] = {}
        self._chains: dict[int, list[int]] = {}  # key -> the hash of each of its whole-block prefixes
        self._holders: dict[int, set[int]] = {}  # prefix hash -> keys holding that prefix
        self._first: dict[int, set[int]] = {}  # first token -> keys starting with it (matches under a block)

    def __contains__(self, key: int) -> bool:
        return key in self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def tokens(self, key: int) -> list[int]:
        return self._tokens[key]

    def insert(self, key: int, tokens: list[int]) -> None:
        if key in self._tokens:
            self.remove(key)
        held = self._tokens[key] = list(tokens)
        chain = self._chains[key] = _chain(held, len(held) // BLOCK)
        for h in chain:
            self._holders.setdefault(h, set()).add(key)
        if held:
            self._first.setdefault(held[0], set()).add(key)

    def remove(self, key: int) -> None:
        held = self._tokens.pop(key)
        for h in self._chains.pop(key):
            _discard(self._holders, h, key)
        if held:
            _discard(self._first, held[0], key)

    def longest(self, tokens: list[int], allowed: set[int] | None = None) -> tuple[int, int]:
        """(key, length) of the longest prefix of tokens held under any key (in allowed; the lowest key of
        those that share the most); (-1, 0) if none."""
        if not tokens:
            return -1, 0
        holders: set[int] | None = None
        depth, h = 0, 0
        for i in range(0, len(tokens) - BLOCK + 1, BLOCK):
            h = hash((h, *tokens[i : i + BLOCK]))
            keys = self._holders.get(h)
            if keys is not None and allowed is not None:
                keys = keys & allowed
            if not keys:
                break
            holders, depth = keys, i + BLOCK
        if holders is None:
            holders = self._first.get(tokens[0], set())
            if allowed is not None:
                holders = holders & allowed
        best, best_n = -1, 0
        for key in holders:
            held = self._tokens[key]
            n = depth + common_prefix(tokens[depth : depth + BLOCK], held[depth : depth + BLOCK])
            if n > best_n or (n == best_n and key < best):
                best, best_n = key, n
        if best >= 0 and self._tokens[best][:depth] != tokens[:depth]:  # a hash collision: match token by token
            return self._scan(tokens, allowed)
        return best, best_n

    def _scan(self, tokens: list[int], allowed: set[int] | None) -> tuple[int, int]:
        best, best_n = -1, 0
        for key in sorted(self._tokens if allowed is None else allowed & self._tokens.keys()):
            n = common_prefix(tokens, self._tokens[key])
            if n > best_n:
                best, best_n = key, n
        return best, best_n


def _chain(tokens: list[int], n_blocks: int) -> list[int]:
    """The hash of each of the first n_blocks whole-block prefixes of tokens."""
    chain, h = [], 0
    for i in range(0, n_blocks * BLOCK, BLOCK):
        h = hash((h, *tokens[i : i + BLOCK]))
        chain.append(h)
    return chain


def _discard(index: dict[int, set[int]], at: int, key: int) -> None:
    keys = index[at]
    keys.discard(key)
    if not keys:
        del index[at]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share (list comparisons in C, halving the range: no loop per token)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; they differ before hi
    while hi - lo > 8:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo
