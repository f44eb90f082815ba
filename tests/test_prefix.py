"""The prefix index, without a model."""

import random

import pytest

from edgeinfer.engine.prefix import PrefixIndex, common_prefix

pytestmark = pytest.mark.pure


def test_longest_shared_prefix_and_removal():
    t = PrefixIndex()
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
    t = PrefixIndex()
    t.insert(1, [1, 2, 3])
    t.insert(2, [1, 2])
    assert t.longest([1, 2, 3], allowed={2}) == (2, 2)
    t.insert(2, [1, 2, 3, 4])  # a key's tokens can grow (the next chat turn)
    assert t.longest([1, 2, 3, 4, 5]) == (2, 4)
    assert t.tokens(2) == [1, 2, 3, 4]


def test_longest_matches_a_token_by_token_scan_across_block_boundaries():
    """The index hashes whole 16-token blocks: lengths inside, at and past a block's end, prompts shorter than a
    block, and many keys sharing blocks must give what comparing token by token gives."""

    rng = random.Random(7)
    base = [rng.randrange(50) for _ in range(80)]
    t, held = PrefixIndex(), {}
    for key in range(40):
        cut = rng.choice([0, 1, 5, 15, 16, 17, 31, 32, 33, 47, 48, 64, 80])
        tokens = base[:cut] + [rng.randrange(50, 60) for _ in range(rng.randrange(0, 20))]
        if not tokens:
            continue
        t.insert(key, tokens)
        held[key] = tokens
    for key in list(held)[::3]:
        t.remove(key)
        del held[key]
    for cut in range(0, 81):
        prompt = [*base[:cut], 99]
        for allowed in (None, set(list(held)[::2])):
            keys = sorted(held if allowed is None else allowed & held.keys())
            lengths = {k: common_prefix(prompt, held[k]) for k in keys}
            n = max(lengths.values(), default=0)
            want = (min(k for k in keys if lengths[k] == n), n) if n else (-1, 0)
            assert t.longest(prompt, allowed) == want, (cut, allowed)


def test_common_prefix_is_exact_at_every_length():
    a = list(range(100))
    for n in range(101):
        b = a[:n] + [-1] * 5
        assert common_prefix(a, b) == n and common_prefix(b, a) == n
    assert common_prefix(a, a[:40]) == 40 and common_prefix([], a) == 0


def test_a_hash_collision_never_gives_a_wrong_match(monkeypatch):
    import edgeinfer.engine.prefix as prefix

    monkeypatch.setattr(prefix, "hash", lambda _: 0, raising=False)  # every block of every list collides
    t = PrefixIndex()
    t.insert(1, list(range(40)))
    t.insert(2, [*range(20), *range(100, 120)])
    assert t.longest([*range(20), 100, 7]) == (2, 21)
    assert t.longest(list(range(33))) == (1, 33)
    assert t.longest([5] * 40) == (-1, 0)
