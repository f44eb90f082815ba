"""The adaptive controller on synthetic costs: it drafts where it pays and steps back where it does not."""

import itertools
from dataclasses import dataclass, field

import pytest

from edgeinfer.options import EngineConfig, SamplingParams
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
    # Unmeasured, nothing to cap by: a plain step, which times the base.
    assert Controller(max_draft=8).plan([Candidate(1, 0.9, 8)], 1, 1, False) == {}


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


def test_unmeasured_costs_take_a_plain_step_first_and_then_price_drafts_against_it():
    ctl = Controller(max_draft=8)
    cands = [Candidate(1, 0.5, 8), Candidate(2, 0.8, 8)]
    assert ctl.plan(cands, 2, 2, False) == {}
    ctl.target.observe(2, 0.010)  # the plain step that followed
    ctl.target.observe(3, 0.0105)  # and a step of three tokens, once: an extra token costs little
    assert ctl.plan(cands, 2, 2, False)[2] >= 1


def test_a_fresh_servers_first_steps_after_a_long_prompt_are_not_priced_by_its_prompt_chunks():
    """Measured: a fresh engine (--spec auto), one stream, a 7,680-token prompt. Only its 512-token chunks were timed
    (4.9 s each), so a one-token step was estimated at 4.9 s and every extra token looked free: eight drafts a step.
    That step (9 tokens, 137 ms) then taught a multiple of 0.03 against the 4.9 s, and ten more such steps followed
    (130-137 ms each, against a plain step of 35 ms: the answer's ITL p99 was 3.9x its p50)."""
    ctl = Controller(max_draft=8)
    for _ in range(15):
        ctl.target.observe(512, 4.86)
    one = [Candidate(1, alpha=0.95, available=8)]
    assert ctl.plan(one, 1, 1, False) == {}  # a plain step: it times the one-token step
    ctl.target.observe(9, 0.137, drafts=8)  # had a step with drafts come anyway, against an untimed base
    assert ctl.target.ratios == {}  # it teaches no multiple
    ctl.target.observe(1, 0.035)
    plan = ctl.plan(one, 1, 1, False)
    assert 1 <= plan[1] <= 2  # priced against the 35 ms step, and held within the cap by size


def test_a_step_estimated_from_prompt_chunks_alone_takes_a_plain_step():
    """Only two prompt chunks measured, the larger much slower: the line through them, extrapolated down to a one-token
    step, ends below zero and is clamped to 0 s. The rate without drafts (streams / T) divided by that, and a
    ZeroDivisionError switched speculation off for the server's life."""
    ctl = Controller(max_draft=8)
    ctl.target.observe(64, 0.1)
    ctl.target.observe(96, 0.5)
    assert ctl.target.estimate(1) == 0.0
    assert ctl.plan([Candidate(1, 0.9, 8)], base_tokens=1, n_decoding=1, uses_draft_model=False) == {}


def test_acceptance_moves_towards_what_is_observed():
    a = Acceptance(0.5)
    for _ in range(20):
        a.update(drafted=4, accepted=4)
    assert a.alpha > 0.9
    for _ in range(20):
        a.update(drafted=4, accepted=0)
    assert a.alpha < 0.1


def run_gate(g, n_decoding, steps, with_drafts, without):
    """Steps at one batch size: each drafts where the gate allows, at that rate (tok/s); returns which did."""
    drafted = []
    for _ in range(steps):
        on = g.allows(n_decoding)
        g.observe(n_decoding, drafted=on, tokens=1, seconds=1 / (with_drafts if on else without))
        drafted.append(on)
    return drafted


def test_gate_switches_drafting_off_where_it_delivers_less_and_keeps_probing():
    from edgeinfer.speculative.control import Gate

    g = Gate(probe_every=10, retry_every=50, min_samples=3)
    worse = run_gate(g, 4, 400, with_drafts=80, without=100)
    # Drafts until the baseline is measured (3 probes), then trials of 3 steps after pauses that double.
    assert sum(worse[:30]) == 27  # all but the probes
    trials = [i for i in range(30, 400) if worse[i] and not worse[i - 1]]
    assert all(worse[i : i + 3] == [True] * 3 and not any(worse[i + 3 : i + 6]) for i in trials)
    gaps = [b - a for a, b in itertools.pairwise(trials)]
    assert len(trials) == 3 and gaps[1] >= 2 * gaps[0] - 3
    better = run_gate(g, 1, 100, with_drafts=150, without=100)
    assert sum(better) == 90  # all but the baseline probes


def test_a_gate_shut_by_a_bad_start_opens_at_its_next_trial():
    from edgeinfer.speculative.control import Gate

    g = Gate(probe_every=16, retry_every=64, min_samples=4)
    bad = run_gate(g, 1, 70, with_drafts=50, without=80)  # drafts until the 4th probe measured the baseline
    assert bad[:63].count(False) == 3 and not any(bad[64:])
    steps = run_gate(g, 1, 300, with_drafts=110, without=80)  # the next trial finds drafting pays: it stays on
    first = steps.index(True)
    assert first < 70 and all(on or (70 + first + i + 1) % 16 == 0 for i, on in enumerate(steps[first:]))


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
        assert index.draft(3) == ([3, 5, 2], 2)  # "1, 2" last went on with "3, 5" at position 8; matched: 2 tokens


def test_a_draft_is_backed_by_how_much_context_matched_before_it():
    from edgeinfer.speculative.ngram import BACKING, NgramIndex

    text = list(range(100, 140))
    copying = NgramIndex()
    copying.extend([1, 2, *text, 3, 4, *text[:12]])  # writing the 40 tokens out again, 12 so far
    assert copying.draft(4) == (text[12:16], 12)
    whole = NgramIndex()
    whole.extend([*text, 5, *text])  # the whole run again: the match counts up to BACKING[-1]
    assert whole.draft(2) == ([5, 100], BACKING[-1])
    fresh = NgramIndex()
    fresh.extend([7, 8, 9, 1, 2])
    assert fresh.draft(4) == ([], 0)


@dataclass
class FakeSampler:
    argmax: list[int]  # what the target picks at each row of a verification

    def greedy(self, ctx, row):
        return self.argmax[row]


@dataclass
class FakeStream:
    """What the speculator reads of a decoding stream (engine/stream.py)."""

    id: int
    tokens: list[int]
    params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0))
    index: int = 0
    max_new: int = 256
    n_generated: int = 10
    fork_pending: bool = False
    drafting: object = None
    sampler: object = None
    n_drafted: int = 0
    n_accepted: int = 0

    @property
    def n_computed(self):
        return len(self.tokens) - 1  # the last sampled token is the next step's input


def one_cpu_stream(spec):
    """Step times measured at one stream on the 2-core VM (SmolLM2, 1k tokens of context): 2 tokens cost 1.48 plain
    steps, 4 tokens 2.15 (the extra token pays only if accepted about half the time or more)."""
    for _ in range(3):
        for n, t in ((1, 0.0128), (2, 0.0189), (3, 0.0238), (4, 0.0275), (8, 0.0454)):
            spec.controller.target.observe(n, t)


def test_a_long_match_drafts_and_a_two_token_match_does_not_and_the_rate_is_learned_across_streams():
    from edgeinfer.engine.step import BatchItem
    from edgeinfer.speculative.speculator import Speculator

    spec = Speculator(EngineConfig(spec="auto"), None, None)
    one_cpu_stream(spec)
    text = list(range(100, 140))
    copy = FakeStream(1, [1, 2, *text, 3, 4, *text[:12]])
    loose = FakeStream(2, [1, 2, *text, 3, 4, 7, 8, 9, 110, 111])  # 110, 111 matched, 9 before it not
    for s in (copy, loose):
        spec.attach(s)
    assert spec.propose([copy], 512) == {1: text[12:13]}  # the latency cap: one token at one stream on a CPU
    assert spec.propose([loose], 512) == {}  # 2 tokens matched: right half the time, 0.5 < 1.48 - 1 + margin

    # The long match's drafts are refused three times: its rate falls below what pays.
    for _ in range(3):
        copy.sampler = FakeSampler([999, 999])
        draft = spec.propose([copy], 512)[1]
        item = BatchItem(copy, [copy.tokens[-1], *draft], len(copy.tokens) - 1, [copy], n_draft=len(draft), row0=0)
        assert spec.verify(None, item) == [999]
    assert spec.propose([copy], 512) == {}
    again = FakeStream(3, list(copy.tokens))  # the next answer's stream: the same rate
    spec.attach(again)
    assert spec.propose([again], 512) == {}
    assert spec.propose([loose], 512) == {}


def test_a_drafted_step_estimated_past_the_cap_is_measured_again():
    """At one stream on a CPU a 2-token step costs 1.5 plain ones; a few slow ones on a busy machine put it over
    LATENCY_CAP, and then nothing drafted, so nothing measured it again: the stream never drafted again. Now
    the multiple rises slowly, and an exploring draft goes past the cap every explore_every steps."""
    ctl = Controller(max_draft=8, explore_every=4)
    for _ in range(5):
        ctl.target.observe(1, 0.012)
    ctl.target.observe(2, 0.018, drafts=1)  # 1.5
    for _ in range(3):
        ctl.target.observe(2, 0.036, drafts=1)  # a busy machine: 3.0 three times
    assert ctl.target.estimate(2, base=1) / 0.012 < LATENCY_CAP
    for _ in range(12):
        ctl.target.observe(2, 0.036, drafts=1)  # the cost did rise
    assert ctl.target.estimate(2, base=1) / 0.012 > LATENCY_CAP
    plans = [ctl.plan([Candidate(1, alpha=0.99, available=8)], 1, 1, False) for _ in range(16)]
    assert plans.count({1: 1}) == 2 and plans.count({1: 0}) == 14  # steps 4 and 12 explore (the gap doubles)


def test_exploring_backs_off_while_the_costs_refuse_and_starts_over_when_they_choose():
    """At one stream on a 2-core CPU a 2-token step costs 1.7-1.9 plain ones and drafting does not pay; an
    exploring draft every 32 steps was 1.6% of a chat's gaps between tokens and set their p99. While the costs
    keep refusing, each exploring step comes twice as late as the one before (up to explore_max); once the
    costs choose drafts again, the next refusal explores explore_every steps later."""
    ctl = Controller(max_draft=8, explore_every=4, explore_max=16)
    for _ in range(5):
        ctl.target.observe(1, 0.010)
    for _ in range(5):
        ctl.target.observe(2, 0.019, drafts=1)  # 1.9 plain steps: past the cap, never chosen
    likely = [Candidate(1, alpha=0.99, available=8)]
    explored = [i for i in range(1, 61) if ctl.plan(likely, 1, 1, False) == {1: 1} and ctl.explored]
    assert explored == [4, 12, 28, 44, 60]  # gaps 8, 16, then held at explore_max
    for _ in range(20):
        ctl.target.observe(2, 0.011, drafts=1)  # the machine changed: a drafted step costs little now
    assert sum(ctl.plan(likely, 1, 1, False)[1] for _ in range(3)) > 3 and not ctl.explored  # the costs choose
    for _ in range(40):
        ctl.target.observe(2, 0.030, drafts=1)  # and dear again
    steps = [i for i in range(1, 9) if ctl.plan(likely, 1, 1, False) == {1: 1} and ctl.explored]
    assert steps == [4]  # explore_every after the last chosen plan, not explore_max


def test_an_exploring_draft_is_not_held_against_the_drafts_the_costs_choose():
    from edgeinfer.speculative.speculator import Speculator

    spec = Speculator(EngineConfig(spec="auto"), None, None)
    text = list(range(100, 140))
    s = FakeStream(1, [1, 2, *text, 3, 4, *text[:12]])
    spec.attach(s)
    spec.controller = Controller(spec.max_draft, explore_every=1)  # the costs' first refusal explores
    spec.controller.target.observe(1, 0.0128)
    spec.controller.target.observe(2, 0.040)  # two tokens cost three plain steps: past the cap
    assert spec.propose([s], 512) == {1: text[12:13]}  # an exploring draft
    spec.observe_iteration(1, drafted=True, tokens=1, seconds=0.030)  # refused, and slow
    assert spec.gate.n_on == {}
    spec.controller.target = StepCosts()
    one_cpu_stream(spec)
    assert spec.propose([s], 512) == {1: text[12:13]}  # chosen by the costs: the gate counts it
    spec.observe_iteration(1, drafted=True, tokens=2, seconds=0.019)
    assert spec.gate.n_on == {1: 1}
