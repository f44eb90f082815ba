"""The prefix trie, without a model."""

import pytest

from edgeinfer.engine.prefix import PrefixTrie

pytestmark = pytest.mark.pure


def test_longest_shared_prefix_and_removal():
    t = PrefixTrie()
    t.insert(1, [5, 6, 7, 8])
    t.insert(2, [5, 6, 9])
    assert t.longest([5, 6, 7, 1]) == (1, 3)
    assert t.longest([5, 6, 9, 9]) == (2, 3)
    assert t.longest([5, 6]) in ((1, 2), (2, 2))
    assert t.longest([4]) == (-1, 0)
    t.remove(1)
    assert t.longest([5, 6, 7, 1]) == (2, 2)
    assert 1 not in t and len(t) == 1
    t.remove(2)
    assert t.longest([5]) == (-1, 0)


def test_allowed_keys_and_reinsert():
    t = PrefixTrie()
    t.insert(1, [1, 2, 3])
    t.insert(2, [1, 2])
    assert t.longest([1, 2, 3], allowed={2}) == (2, 2)
    t.insert(2, [1, 2, 3, 4])  # a key's tokens can grow (the next chat turn)
    assert t.longest([1, 2, 3, 4, 5]) == (2, 4)
    assert t.tokens(2) == [1, 2, 3, 4]
