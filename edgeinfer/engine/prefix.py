"""Prefix matching: a trie over token ids (which held KV shares the longest prefix with a prompt)."""

from __future__ import annotations


class _Node:
    __slots__ = ("children", "owners")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.owners: set[int] = set()  # keys whose token list passes through this node


class PrefixTrie:
    """Maps keys (sequence or stream ids) to token lists; finds the longest shared prefix."""

    def __init__(self) -> None:
        self._root = _Node()
        self._tokens: dict[int, list[int]] = {}

    def __contains__(self, key: int) -> bool:
        return key in self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def tokens(self, key: int) -> list[int]:
        return self._tokens[key]

    def insert(self, key: int, tokens: list[int]) -> None:
        if key in self._tokens:
            self.remove(key)
        self._tokens[key] = list(tokens)
        node = self._root
        for t in tokens:
            node = node.children.setdefault(t, _Node())
            node.owners.add(key)

    def remove(self, key: int) -> None:
        tokens = self._tokens.pop(key)
        node = self._root
        for t in tokens:
            child = node.children[t]
            child.owners.discard(key)
            if not child.owners:
                del node.children[t]  # nothing else passes here: drop the branch
                return
            node = child

    def longest(self, tokens: list[int], allowed: set[int] | None = None) -> tuple[int, int]:
        """(key, length) of the longest prefix of tokens held under any key (in allowed); (-1, 0) if none."""
        node, depth, best = self._root, 0, -1
        for t in tokens:
            child = node.children.get(t)
            if child is None:
                break
            owners = child.owners if allowed is None else child.owners & allowed
            if not owners:
                break
            node, depth, best = child, depth + 1, min(owners)
        return best, depth


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
