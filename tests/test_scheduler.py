"""The scheduler without a model: hand-built steps, checking batches, KV ops and accounting."""

from types import SimpleNamespace

import pytest

from edgeinfer.engine.requests import check_request
from edgeinfer.engine.scheduler import Scheduler, Status, StepOutput
from edgeinfer.errors import QueueFullError, RequestError
from edgeinfer.options import SamplingParams


def make(n_ctx=1000, streams=4, ids=None, budget=64, retained=0, queue=None):
    return Scheduler(n_ctx, streams, ids or streams + retained, budget, retained, queue)


def sample_all(s, plan, token=7):
    """Pretend the plan was decoded and every sampling stream drew `token`."""
    return s.postprocess(plan, [StepOutput(st, [token]) for it in plan.items for st in it.samplers])


def run_step(s, sampled_token=7):
    """Plan a step, pretend to decode it, append a token for every sampler."""
    plan = s.schedule()
    sample_all(s, plan, sampled_token)
    return plan


def test_decode_tokens_come_first_then_prompt_chunks_within_budget():
    s = make(budget=16)
    g1 = s.add(list(range(1, 6)), 1, 10)
    run_step(s)  # g1 prefilled: 5 tokens, samples
    g2 = s.add(list(range(100, 140)), 1, 10)
    plan = s.schedule()
    assert plan.items[0].stream is g1.streams[0] and len(plan.items[0].tokens) == 1
    assert plan.items[1].stream is g2.streams[0] and len(plan.items[1].tokens) == 15
    assert plan.items[1].samplers == []  # a chunk that does not end the prompt needs no logits
    assert plan.n_tokens == 16


def test_long_prompt_is_chunked_and_samples_only_at_its_end():
    s = make(budget=8)
    g = s.add(list(range(1, 21)), 1, 5)
    chunks = []
    while not g.streams[0].n_generated:
        plan = run_step(s)
        chunks.append((len(plan.items[0].tokens), bool(plan.items[0].samplers)))
    assert chunks == [(8, False), (8, False), (4, True)]
    assert g.streams[0].n_computed == 20


def test_parallel_limit_queues_in_order():
    s = make(streams=2)
    groups = [s.add([1, 2, 3], 1, 4) for _ in range(3)]
    s.schedule()
    assert [g.streams[0].status for g in groups] == [Status.RUNNING, Status.RUNNING, Status.WAITING]
    s.finish(groups[0].streams[0], Status.STOPPED)
    plan = s.schedule()
    assert groups[2].streams[0].status == Status.RUNNING
    assert any(op.kind == "rm" and op.seq == groups[0].streams[0].seq for op in plan.kv_ops)


def test_kv_reservation_blocks_admission_until_cells_free():
    s = make(n_ctx=100, streams=4)
    a = s.add([1] * 30, 1, 30)  # reserves 60
    b = s.add([2] * 30, 1, 30)  # needs 60: waits
    s.schedule()
    assert a.streams[0].status == Status.RUNNING and b.streams[0].status == Status.WAITING
    assert s.cells_used == 60
    s.finish(a.streams[0], Status.LENGTH)
    s.schedule()
    assert b.streams[0].status == Status.RUNNING and s.cells_used == 60


def test_requests_that_can_never_be_served_are_refused_at_the_door():
    engine = SimpleNamespace(n_ctx=100, config=SimpleNamespace(parallel=4), vocab=SimpleNamespace(n_tokens=50))
    engine.default_max_tokens = 256
    with pytest.raises(RequestError, match="max_tokens is 50, but only 40 tokens fit") as e:
        check_request([1] * 60, 1, SamplingParams(max_tokens=50), engine)
    assert e.value.param == "max_tokens"
    with pytest.raises(RequestError, match="1 to 4"):
        check_request([1], 5, SamplingParams(), engine)
    with pytest.raises(RequestError, match="empty"):
        check_request([], 1, SamplingParams(), engine)
    with pytest.raises(RequestError, match="vocabulary"):
        check_request([50], 1, SamplingParams(), engine)
    with pytest.raises(RequestError, match="context holds 100"):
        check_request([1] * 100, 1, SamplingParams(), engine)
    # Without max_tokens a stream gets what fits: 3 streams share 90 cells after a 10-token prompt.
    assert check_request([1] * 10, 3, SamplingParams(), engine) == 30


def test_verified_drafts_and_an_early_stop_leave_only_the_kept_positions():
    s = make(budget=64)
    g = s.add([1, 2, 3], 1, 10)
    run_step(s)
    st = g.streams[0]
    plan = s.schedule({st.id: [20, 21, 22]})
    (item,) = plan.items
    assert item.tokens == [7, 20, 21, 22] and item.n_draft == 3 and item.draft == [20, 21, 22]
    # Two drafts accepted, the third rejected; the target's own token 30 follows.
    s.postprocess(plan, [StepOutput(st, [20, 21, 30], n_rejected=1)])
    assert st.tokens == [1, 2, 3, 7, 20, 21, 30] and st.n_computed == 6
    assert [(op.kind, op.seq, op.p0) for op in s.schedule().kv_ops] == [("rm", st.seq, 6)]


def test_queue_bound():
    s = make(streams=1, queue=1)
    s.add([1], 1, 1)  # a slot is free: it starts at the next step, it is not queued
    s.add([1], 1, 1)  # queued
    with pytest.raises(QueueFullError):
        s.add([1], 1, 1)
    run_step(s)  # the first runs, the second still waits
    with pytest.raises(QueueFullError):
        s.add([1], 1, 1)


def test_fork_children_share_the_prompt_and_sample_from_the_leader_row():
    s = make(budget=64)
    g = s.add([5, 6, 7, 8], 3, 4)
    plan = s.schedule()
    assert len(plan.items) == 1  # only the leader prefills
    assert plan.items[0].samplers == g.streams
    sample_all(s, plan, 9)
    plan = s.schedule()
    leader = g.streams[0]
    cps = [op for op in plan.kv_ops if op.kind == "cp"]
    assert [(op.seq, op.dst, op.p0, op.p1) for op in cps] == [(leader.seq, c.seq, 0, 4) for c in g.streams[1:]]
    assert len(plan.items) == 3 and all(len(it.tokens) == 1 and it.pos0 == 4 for it in plan.items)
    assert s.cells_used == 4 + 3 * 4


def test_cancel_frees_the_sequence_at_the_next_step():
    s = make(retained=0)
    g = s.add([1, 2, 3], 1, 8)
    run_step(s)
    st = g.streams[0]
    s.cancel(st)
    plan = s.schedule()
    assert plan.finished == [st] and st.status == Status.CANCELLED
    assert [(op.kind, op.seq, op.p0, op.p1) for op in plan.kv_ops] == [("rm", st.seq, -1, -1)]
    assert not s.running and s.cells_used == 0 and st.seq in s.free_seqs


def test_cancel_while_waiting():
    s = make(streams=1)
    s.add([1], 1, 2)
    g = s.add([2], 1, 2)
    s.schedule()
    s.cancel(g.streams[0])
    plan = s.schedule()
    assert plan.finished == [g.streams[0]] and not s.waiting


def test_next_turn_continues_in_the_kept_sequence():
    s = make(retained=2)
    g = s.add([1, 2, 3, 4, 5], 1, 3)
    run_step(s, 6)
    run_step(s, 7)
    st = g.streams[0]
    s.finish(st, Status.STOPPED)  # KV holds 1..6 (7 was sampled, never decoded)
    assert s.retained[st.seq] == [1, 2, 3, 4, 5, 6]
    g2 = s.add([1, 2, 3, 4, 5, 6, 7, 8, 9], 1, 3)  # the kept tokens are a prefix: take the sequence over
    plan = s.schedule()
    new = g2.streams[0]
    assert new.seq == st.seq and new.n_cached == 6 and not s.retained
    assert [(op.kind, op.seq, op.p0) for op in plan.kv_ops] == [("rm", st.seq, 6)]
    assert plan.items[0].tokens == [7, 8, 9] and plan.items[0].pos0 == 6
    assert s.prompt_tokens_cached == 6


def test_divergence_inside_a_kept_prefix_copies_up_to_it_and_keeps_the_entry():
    s = make(retained=2)
    system = list(range(100, 140))  # a 40-token shared system prompt
    g = s.add([*system, 1, 2], 1, 2)
    run_step(s)
    s.finish(g.streams[0], Status.STOPPED)
    kept = g.streams[0].seq
    g2 = s.add([*system, 7, 8, 9], 1, 2)
    plan = s.schedule()
    new = g2.streams[0]
    assert new.seq != kept and new.n_cached == 40 and kept in s.retained
    assert [(op.kind, op.seq, op.dst, op.p0, op.p1) for op in plan.kv_ops] == [("cp", kept, new.seq, 0, 40)]
    assert plan.items[0].tokens == [7, 8, 9] and plan.items[0].pos0 == 40


def test_short_shared_prefixes_are_computed_again():
    s = make(retained=2)
    g = s.add([1, 2, 3, 4, 5], 1, 2)
    run_step(s)
    s.finish(g.streams[0], Status.STOPPED)
    g2 = s.add([1, 2, 3, 9, 9], 1, 2)
    s.schedule()
    assert g2.streams[0].n_cached == 0 and len(s.retained) == 1


def test_concurrent_requests_sharing_a_prompt_prefix_compute_it_once():
    s = make(streams=4, budget=64)
    system = list(range(100, 150))  # 50 tokens
    groups = [s.add([*system, 200 + i, 300 + i], 1, 4) for i in range(3)]
    plan = s.schedule()
    # Only the first computes the shared prefix; the others wait for it.
    assert [it.stream for it in plan.items] == [groups[0].streams[0]]
    sample_all(s, plan, 7)
    plan = s.schedule()
    cps = [(op.seq, op.dst, op.p1) for op in plan.kv_ops if op.kind == "cp"]
    leader = groups[0].streams[0]
    assert cps == [(leader.seq, g.streams[0].seq, 50) for g in groups[1:]]
    # Each follower computes only its own two tokens.
    follower_items = [it for it in plan.items if it.stream is not leader]
    assert [(it.tokens, it.pos0) for it in follower_items] == [([201, 301], 50), ([202, 302], 50)]
    assert s.prompt_tokens_cached == 100


def test_full_prompt_hit_recomputes_the_last_token():
    s = make(retained=1)
    g = s.add([1, 2, 3], 1, 2)
    run_step(s)
    s.finish(g.streams[0], Status.STOPPED)
    s.add([1, 2, 3], 1, 2)
    plan = s.schedule()
    assert plan.items[0].tokens == [3] and plan.items[0].pos0 == 2


def test_retained_prefixes_are_evicted_lru_when_admission_needs_room():
    s = make(n_ctx=40, streams=2, retained=2)
    a = s.add([1] * 10, 1, 5)
    run_step(s)
    s.finish(a.streams[0], Status.STOPPED)
    b = s.add([2] * 10, 1, 5)
    run_step(s)
    s.finish(b.streams[0], Status.STOPPED)
    assert len(s.retained) == 2 and s.cells_used == 20  # each KV holds its 10 prompt tokens
    c = s.add([3] * 20, 1, 10)  # needs 30 of 40, 20 free: evicting the oldest (a) is enough
    plan = s.schedule()
    assert c.streams[0].status == Status.RUNNING
    assert s.evictions == 1 and list(s.retained) == [b.streams[0].seq]
    assert [op.seq for op in plan.kv_ops if op.kind == "rm"] == [a.streams[0].seq]
    assert s.cells_used == 40


def test_retained_cells_stay_within_what_running_streams_reserve():
    """Stale prefixes cost every decode step (attention reads every occupied cell), so they go
    once streams run, least recently used first, down to what the running streams reserve."""
    s = make(n_ctx=1600, streams=4, retained=8, budget=256)  # the floor is 1600 // 16 = 100 cells
    groups = [s.add([10 + k] * 50, 1, 5) for k in range(4)]
    run_step(s)
    for g in groups:
        s.finish(g.streams[0], Status.STOPPED)
    assert len(s.retained) == 4 and s.evictions == 0  # nothing runs: idle prefixes cost nothing
    newest = list(s.retained)[-1]
    g = s.add([13] * 40 + [99] * 40, 1, 30)  # copies 40 tokens of the newest entry; reserves 110 cells
    plan = s.schedule()
    assert g.streams[0].n_cached == 40
    assert s.evictions == 2 and list(s.retained)[-1] == newest  # 100 cells held: the two used last
    assert [op.kind for op in plan.kv_ops] == ["cp", "rm", "rm"]  # the copy is made before cells are freed
