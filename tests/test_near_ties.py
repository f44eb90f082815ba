"""The soak's near-tie check (scripts/near_ties.py) on a scripted model, where every tie is known."""

from types import SimpleNamespace

import pytest

from edgeinfer.events import TokenLogprob

from .gate import near_ties

pytestmark = pytest.mark.pure

EOS = 0
TEXT = {EOS: "", 1: " It", 2: " is", 3: " a", 4: " also", 5: " big", 6: " red"}
PROMPT = [99]
MAX_TOKENS = 16
TIE_NATS = 0.5  # a scripted rule; on the real model it is measured (near_ties.measure_drift)


class ScriptedEngine:
    """Greedy generation from a table: context past the prompt -> (token, logprob) candidates."""

    def __init__(self, table: dict[tuple[int, ...], list[tuple[int, float]]]):
        self.table = table
        self.vocab = SimpleNamespace(is_eog=lambda t: t == EOS)

    def generate(self, ids, params):
        ids, out, lps = list(ids), [], []
        for _ in range(params.max_tokens):
            cands = sorted(self.table.get(tuple(ids[len(PROMPT) :]), [(EOS, 0.0)]), key=lambda c: -c[1])
            tok, lp = cands[0]
            if tok == EOS and not params.ignore_eos:
                break
            top = [(t, TEXT[t], v) for t, v in cands]
            out.append(tok)
            lps.append(TokenLogprob(tok, TEXT[tok], lp, top))
            ids.append(tok)
        return SimpleNamespace(token_ids=out, logprobs=lps)


def check(table, text: str, tie_nats: float = TIE_NATS) -> tuple[str | None, list[float]]:
    gaps: list[float] = []
    ans = near_ties.Answer(PROMPT, text, MAX_TOKENS, tie_nats)
    return near_ties._parts_at_near_ties_only(ScriptedEngine(table), ans, PROMPT, "", gaps), gaps


def fork_table(gap: float):
    """Alone: ' It is a big'. After ' It is', ' also' trails ' a' by gap and leads to ' a red'."""
    return {
        (): [(1, -0.1)],
        (1,): [(2, -0.1)],
        (1, 2): [(3, -1.0), (4, -1.0 - gap)],
        (1, 2, 3): [(5, -0.1), (6, -3.0)],
        (1, 2, 4): [(3, -0.2)],
        (1, 2, 4, 3): [(6, -0.1)],
    }


def test_the_alone_answer_passes_with_no_ties():
    assert check(fork_table(0.1), " It is a big") == (None, [])


def test_a_longer_token_that_the_reference_matched_as_text_is_a_near_tie():
    # " a" is a text prefix of " also": the walk must come back to that fork (it failed here before)
    why, gaps = check(fork_table(0.1), " It is also a red")
    assert why is None
    assert [round(g, 3) for g in gaps] == [0.1]


def test_a_confident_parting_at_such_a_fork_fails():
    why, _ = check(fork_table(2.0), " It is also a red")
    assert why and "none of the reference's top five" in why


def test_a_parting_where_the_reference_was_confident_fails():
    table = fork_table(0.1) | {(1, 2, 3): [(5, -0.1), (6, -1.5)]}
    why, _ = check(table, " It is a red")
    assert why and "confident (1.40 nats)" in why
    assert check(table, " It is a red", tie_nats=1.5)[0] is None  # a CPU that drifts further accepts it


def test_more_near_ties_than_the_cap_fail():
    # each step: ' a' and ' big' nearly tie; the answer always takes ' big'
    budget = near_ties.max_forced(MAX_TOKENS)
    n = budget + 1
    table = {tuple([5] * i): [(3, -0.5), (5, -0.6), (EOS, -0.7)] for i in range(n + 1)}
    why, _ = check(table, " big" * n)
    assert why and f"more than {budget} near-ties in {MAX_TOKENS} tokens" in why
    assert check(table, " big" * (n - 1))[0] is None


def test_the_budget_of_near_ties_grows_with_the_text():
    assert near_ties.max_forced(16) < near_ties.max_forced(80) < near_ties.max_forced(300)
