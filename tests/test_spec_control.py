"""The adaptive controller on synthetic costs: it drafts where it pays and steps back where it does not."""

import pytest

from edgeinfer.speculative.control import LATENCY_CAP, Acceptance, Candidate, Controller, StepCosts

pytestmark = pytest.mark.pure


def cpu_like(c: StepCosts, fixed=0.010, per_token=0.004):
    """Step time = fixed weight reading + per-token compute (seconds)."""
    for n in (1, 2, 4, 8, 16, 32, 64, 128):
        c.observe(n, fixed + per_token * n)


def test_step_costs_interpolate_between_measured_sizes():
    c = StepCosts()
    c.observe(2, 0.02)
    c.observe(8, 0.08)
    assert abs(c.estimate(5) - 0.05) < 1e-9
    assert c.estimate(32) > c.estimate(8)  # extrapolated upwards
    assert StepCosts().estimate(4) is None


def test_drafts_at_low_load_and_steps_back_at_high_load():
    ctl = Controller(max_draft=8)
    cpu_like(ctl.target, fixed=0.010, per_token=0.001)
    one = ctl.plan([Candidate(1, alpha=0.9, available=8)], base_tokens=1, n_decoding=1, uses_draft_model=False)
    assert one[1] >= 3
    many = [Candidate(i, alpha=0.9, available=8) for i in range(16)]
    busy = ctl.plan(many, base_tokens=16, n_decoding=16, uses_draft_model=False)
    ctl_busy = Controller(max_draft=8)
    cpu_like(ctl_busy.target, fixed=0.010, per_token=0.004)
    busier = ctl_busy.plan(many, base_tokens=16, n_decoding=16, uses_draft_model=False)
    # Cheap extra tokens (1 ms each at 16 streams): short drafts still pay, as many as keep the step within
    # LATENCY_CAP plain ones' time (1.75 x 26 ms: one token each of the two that pay).
    total = sum(busy.values())
    assert set(busy.values()) == {1}
    assert ctl.target.estimate(16 + total) <= LATENCY_CAP * ctl.target.estimate(16)
    # Compute-bound (4 ms per token): one more token costs more than it can bring back.
    assert set(busier.values()) == {0}


def test_a_step_with_drafts_takes_at_most_latency_cap_plain_ones():
    """On a CPU a lone stream's extra token costs most of a step (measured: 2 tokens 1.7x, 9 tokens about 4x);
    drafts that pay on average would still keep each token waiting four steps: the cap holds it under two."""
    ctl = Controller(max_draft=8)
    cpu_like(ctl.target, fixed=0.003, per_token=0.007)  # T(1) = 10 ms, T(2) = 17 ms, T(9) = 66 ms
    assert ctl.plan([Candidate(1, alpha=0.99, available=8)], 1, 1, False) == {1: 1}  # T(2) <= 1.75 T(1) < T(3)
    for n in (1, 2, 4):
        ctl.draft.observe(n, 0.004)  # a draft model's step, before the target's
    assert ctl.plan([Candidate(1, alpha=0.99, available=8)], 1, 1, True) == {1: 0}  # 17 + 4 ms > 17.5 ms
    # Unmeasured, nothing to cap by: the exploring draft goes ahead.
    assert Controller(max_draft=8).plan([Candidate(1, 0.9, 8)], 1, 1, False) == {1: 2}


def test_a_step_with_drafts_is_costed_against_the_plain_step_at_todays_context():
    """Measured drafted sizes go stale as the context grows: at one stream, after 1k tokens grew to 4k, seconds
    kept by size said two tokens cost less than one did now, and the step of five they allowed took 2.4 plain
    ones. A step with drafts is costed as its measured multiple of the plain step, which is measured now."""
    ctl = Controller(max_draft=8)
    for _ in range(10):
        ctl.target.observe(1, 0.010)
    ctl.target.observe(2, 0.016, drafts=1)  # at the short context: 1.6 plain steps
    ctl.target.observe(3, 0.020, drafts=2)  # 2.0
    for _ in range(30):  # the context grows; the plain step follows it
        ctl.target.observe(1, 0.022)
    assert ctl.target.estimate(3, base=1) == pytest.approx(0.044, rel=0.01)  # by size alone: 20 ms
    assert ctl.target.estimate(5, base=1) == pytest.approx(0.022 * 2.8, rel=0.01)  # 1.0, 1.6, 2.0, then +0.4 a token
    # A stream sure of its drafts: the cost model pays for many, the cap keeps what fits in 1.75 plain steps.
    assert ctl.plan([Candidate(1, alpha=0.99, available=8)], 1, 1, False) == {1: 1}


def test_low_acceptance_gets_no_draft():
    ctl = Controller(max_draft=8)
    cpu_like(ctl.target, fixed=0.010, per_token=0.001)
    plan = ctl.plan([Candidate(1, 0.9, 8), Candidate(2, 0.05, 8)], base_tokens=2, n_decoding=2, uses_draft_model=False)
    assert plan[1] > 0 and plan[2] == 0


def test_a_draft_model_as_costly_as_the_target_is_not_used():
    ctl = Controller(max_draft=8)
    cpu_like(ctl.target, fixed=0.010, per_token=0.001)
    for n in (1, 2, 4):
        ctl.draft.observe(n, 0.0105)  # one draft step costs a whole target step
    plan = ctl.plan([Candidate(1, 0.97, 8)], base_tokens=1, n_decoding=1, uses_draft_model=True)
    assert plan[1] <= 1
    cheap = Controller(max_draft=8)
    cpu_like(cheap.target, fixed=0.010, per_token=0.0005)
    for n in (1, 2, 4):
        cheap.draft.observe(n, 0.0008)
    assert cheap.plan([Candidate(1, 0.97, 8)], 1, 1, True)[1] >= 4


def test_unmeasured_costs_explore_with_a_short_draft():
    ctl = Controller(max_draft=8)
    plan = ctl.plan([Candidate(1, 0.5, 8), Candidate(2, 0.8, 8)], 2, 2, False)
    assert plan == {2: 2}


def test_acceptance_moves_towards_what_is_observed():
    a = Acceptance(0.5)
    for _ in range(20):
        a.update(drafted=4, accepted=4)
    assert a.alpha > 0.9
    for _ in range(20):
        a.update(drafted=4, accepted=0)
    assert a.alpha < 0.1


def test_gate_switches_drafting_off_where_it_delivers_less_and_keeps_probing():
    from edgeinfer.speculative.control import Gate

    g = Gate(probe_every=10, retry_every=50, min_samples=3, weight=0.1)
    for _ in range(5):
        g.observe(4, drafted=True, tokens=8, seconds=0.10)  # 80 tok/s with drafts
        g.observe(4, drafted=False, tokens=4, seconds=0.04)  # 100 tok/s without
        g.observe(1, drafted=True, tokens=3, seconds=0.02)  # 150 tok/s with drafts
        g.observe(1, drafted=False, tokens=1, seconds=0.01)  # 100 tok/s without
    allowed4 = [g.allows(4) for _ in range(100)]
    allowed1 = [g.allows(1) for _ in range(100)]
    assert 1 <= sum(allowed4) <= 2  # only re-tries, with a growing pause between them
    assert 85 <= sum(allowed1) <= 95  # all but the baseline probes


def test_the_ngram_index_maps_each_ngram_to_where_its_latest_occurrence_went_on():
    from edgeinfer.speculative.ngram import NgramIndex

    tokens = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 2, 3, 5, 9, 1, 2]
    want: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in (4, 3, 2)}
    for i in range(len(tokens)):  # the n-gram before position i (whose token is known), its latest occurrence
        for n in want:
            if i >= n:
                want[n][tuple(tokens[i - n : i])] = i
    whole, piecewise = NgramIndex(), NgramIndex()
    whole.extend(tokens[:-1])
    for t in tokens[:-1]:
        piecewise.extend([t])
    whole.extend(tokens[-1:])
    piecewise.extend(tokens[-1:])
    for index in (whole, piecewise):
        assert index.tables == want
        assert index.draft(3) == [3, 5, 2]  # "1, 2" last went on with "3, 5" at position 8
