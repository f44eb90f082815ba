"""The scheduler without a model: hand-built steps, checking batches, KV calls and accounting."""

from types import SimpleNamespace

import pytest

from edgeinfer.engine.prefix import PrefixIndex
from edgeinfer.engine.requests import check_request
from edgeinfer.engine.scheduler import Scheduler, Status, StepOutput
from edgeinfer.errors import ContextLengthError, QueueFullError, RequestError
from edgeinfer.options import SamplingParams

pytestmark = pytest.mark.pure


class FakeKv:
    """Records every call; keeps saved entries like the RAM tier (by tokens), restores what it holds."""

    def __init__(self, per_seq=False, restorable=True):
        self.calls = []
        self.saved = {}
        self.index = PrefixIndex()
        self.per_seq = per_seq
        self.restorable = restorable

    def rm(self, seq, p0=0):
        self.calls.append(("rm", seq, p0))

    def share(self, src, dst, n):
        self.calls.append(("share", src, dst, n))
        return self.per_seq

    def save(self, seq, tokens):
        self.calls.append(("save", seq, list(tokens)))
        key = len(self.saved)
        self.saved[key] = list(tokens)
        self.index.insert(key, tokens)

    def longest(self, tokens):
        return self.index.longest(tokens)

    def restore(self, key, seq, n):
        self.calls.append(("restore", key, seq, n))
        return self.restorable

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def make(n_ctx=1000, streams=4, budget=64, queue=None, cells_per_seq=None, kv=None):
    return Scheduler(kv or FakeKv(cells_per_seq is not None), n_ctx, streams, budget, cells_per_seq, queue)


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
    assert ("rm", groups[0].streams[0].seq, 0) in s.kv.calls
    s.schedule()
    assert groups[2].streams[0].status == Status.RUNNING


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
    engine.default_max_tokens, engine.per_seq, engine.n_ctx_stream = 256, False, 100
    # A max_tokens past the room is a bound: the stream gets what fits (agents ask for 32,000 whatever fits).
    assert check_request([1] * 60, 1, SamplingParams(max_tokens=50), engine) == 40
    assert check_request([1] * 60, 1, SamplingParams(max_tokens=30), engine) == 30
    with pytest.raises(RequestError, match="1 to 4"):
        check_request([1], 5, SamplingParams(), engine)
    with pytest.raises(RequestError, match="empty"):
        check_request([], 1, SamplingParams(), engine)
    with pytest.raises(RequestError, match="vocabulary"):
        check_request([50], 1, SamplingParams(), engine)
    with pytest.raises(ContextLengthError, match=r"^prompt is too long: 100 tokens > 100 maximum \(the context") as e:
        check_request([1] * 100, 1, SamplingParams(), engine)
    assert (e.value.tokens, e.value.limit, e.value.code) == (100, 100, "context_length_exceeded")
    # Without max_tokens a stream gets what fits: 3 streams share 90 cells after a 10-token prompt.
    assert check_request([1] * 10, 3, SamplingParams(), engine) == 30
    # With a KV stream per sequence each stream has its own 25 cells, prompt included.
    engine.per_seq, engine.n_ctx_stream = True, 25
    assert check_request([1] * 10, 3, SamplingParams(), engine) == 15
    with pytest.raises(RequestError, match=r"a stream's share of the context holds 25: .*--kv-layout unified"):
        check_request([1] * 30, 1, SamplingParams(), engine)


def test_verified_drafts_and_an_early_stop_leave_only_the_kept_positions():
    s = make(budget=64)
    g = s.add([1, 2, 3], 1, 10)
    run_step(s)
    st = g.streams[0]
    plan = s.schedule({st.id: [20, 21, 22]})
    (item,) = plan.items
    assert item.tokens == [7, 20, 21, 22] and item.n_draft == 3 and item.draft == [20, 21, 22]
    # Two drafts accepted, the third rejected; the target's own token 30 follows.
    s.kv.take()
    s.postprocess(plan, [StepOutput(st, [20, 21, 30], n_rejected=1)])
    assert st.tokens == [1, 2, 3, 7, 20, 21, 30] and st.n_computed == 6
    assert s.kv.take() == [("rm", st.seq, 6)]


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
    leader = g.streams[0]
    assert s.kv.take() == [("share", leader.seq, c.seq, 4) for c in g.streams[1:]]
    plan = s.schedule()
    assert len(plan.items) == 3 and all(len(it.tokens) == 1 and it.pos0 == 4 for it in plan.items)
    assert s.cells_used == 4 + 3 * 4


def test_cancel_frees_the_sequence_at_the_next_step():
    s = make()
    g = s.add([1, 2, 3], 1, 8)
    run_step(s)
    st = g.streams[0]
    s.cancel(st)
    s.kv.take()
    plan = s.schedule()
    assert plan.finished == [st] and st.status == Status.CANCELLED
    assert s.kv.take() == [("rm", st.seq, 0)]  # three tokens are too few to be worth saving
    assert not s.running and s.cells_used == 0 and st.seq in s.free_seqs


def test_cancel_while_waiting():
    s = make(streams=1)
    s.add([1], 1, 2)
    g = s.add([2], 1, 2)
    s.schedule()
    s.cancel(g.streams[0])
    plan = s.schedule()
    assert plan.finished == [g.streams[0]] and not s.waiting


def test_an_ended_stream_is_saved_and_its_next_turn_restored_into_a_fresh_sequence():
    s = make()
    prompt = list(range(1, 21))
    g = s.add(prompt, 1, 3)
    run_step(s, 21)
    run_step(s, 22)
    st = g.streams[0]
    s.kv.take()
    s.finish(st, Status.STOPPED)  # KV holds 1..21 (22 was sampled, never decoded)
    assert s.kv.take() == [("save", st.seq, [*prompt, 21]), ("rm", st.seq, 0)]
    assert st.seq in s.free_seqs and s.cells_used == 0  # the cells are free at once
    g2 = s.add([*prompt, 21, 22, 23, 24], 1, 3)  # the saved tokens are a prefix: restore them
    plan = s.schedule()
    new = g2.streams[0]
    assert s.kv.take() == [("restore", 0, new.seq, 21)]
    assert new.n_cached == 21 and plan.items[0].tokens == [22, 23, 24] and plan.items[0].pos0 == 21
    assert s.prompt_tokens_cached == 21


def test_a_stream_ended_by_its_last_token_is_saved_after_the_step_then_its_next_turn_restored():
    """Defect: the copy to the tiers (13 ms for 1k tokens of SmolLM2) ran inside the step, before the step's
    events went out, so every answer's last token came that much late (ITL p99 2.7x p50 at one stream)."""
    s = make()
    prompt = list(range(1, 21))
    g = s.add(prompt, 1, 1)
    plan = s.schedule()
    s.kv.take()
    ended = s.postprocess(plan, [StepOutput(g.streams[0], [21], status=Status.LENGTH)])
    st = g.streams[0]
    assert ended == [st] and st.status == Status.LENGTH and s.cells_used == 0
    assert s.kv.take() == [] and st.seq not in s.free_seqs and s.has_work()  # nothing copied in the step
    s.retire_ended()  # the engine: once the step's events are out
    assert s.kv.take() == [("save", st.seq, prompt), ("rm", st.seq, 0)] and st.seq in s.free_seqs
    assert not s.has_work()
    # Planning a step retires what is left first: the next turn finds the saved prefix.
    g1 = s.add([*prompt, 21, 22], 1, 1)
    s.postprocess(s.schedule(), [StepOutput(g1.streams[0], [5], status=Status.LENGTH)])
    g2 = s.add([*prompt, 21, 22, 5, 6, 7], 1, 1)
    s.kv.take()
    plan = s.schedule()
    assert [c[0] for c in s.kv.take()] == ["save", "rm", "restore"]
    assert plan.items[0].stream is g2.streams[0] and plan.items[0].pos0 == 22


def test_a_failed_save_still_frees_its_sequence_and_the_others_are_saved():
    class FailingKv(FakeKv):
        def save(self, seq, tokens):
            if seq == 0:
                raise RuntimeError("no memory for the copy")
            super().save(seq, tokens)

    s = make(kv=FailingKv())
    groups = [s.add(list(range(10 * i + 1, 10 * i + 21)), 1, 1) for i in range(2)]
    plan = s.schedule()
    s.postprocess(plan, [StepOutput(g.streams[0], [5], status=Status.LENGTH) for g in groups])
    with pytest.raises(RuntimeError, match="no memory"):
        s.retire_ended()
    assert sorted(s.free_seqs) == [0, 1, 2, 3] and not s.has_work()
    assert [c[:2] for c in s.kv.calls if c[0] == "save"] == [("save", 1)]


def test_a_prompt_parting_inside_a_saved_entry_restores_up_to_the_parting():
    s = make()
    system = list(range(100, 140))  # a 40-token shared system prompt
    g = s.add([*system, 1, 2], 1, 2)
    run_step(s)
    s.finish(g.streams[0], Status.STOPPED)
    g2 = s.add([*system, 7, 8, 9], 1, 2)
    s.kv.take()
    plan = s.schedule()
    new = g2.streams[0]
    assert s.kv.take() == [("restore", 0, new.seq, 40)]
    assert new.n_cached == 40 and plan.items[0].tokens == [7, 8, 9] and plan.items[0].pos0 == 40


def test_a_failed_restore_computes_the_prompt():
    s = make(kv=FakeKv(restorable=False))
    s.kv.save(0, list(range(50)))
    g = s.add([*range(50), 99], 1, 2)
    plan = s.schedule()
    assert g.streams[0].n_cached == 0 and plan.items[0].pos0 == 0 and len(plan.items[0].tokens) == 51


def test_short_shared_prefixes_are_computed_again():
    s = make()
    s.kv.save(0, list(range(1, 21)))
    g2 = s.add([1, 2, 3, 9, 9], 1, 2)
    s.schedule()
    assert g2.streams[0].n_cached == 0 and not any(c[0] == "restore" for c in s.kv.calls)


def test_a_saved_prefix_cut_below_16_tokens_by_the_prompt_end_is_computed_again():
    s = make()
    s.kv.save(0, list(range(1, 21)))
    g = s.add(list(range(1, 17)), 1, 2)  # all 16 tokens saved, but the last is computed again: 15 to reuse
    plan = s.schedule()
    assert g.streams[0].n_cached == 0 and not any(c[0] == "restore" for c in s.kv.calls)
    assert plan.items[0].tokens == list(range(1, 17))


def test_concurrent_requests_sharing_a_prompt_prefix_compute_it_once():
    s = make(streams=4, budget=64)
    system = list(range(100, 150))  # 50 tokens
    groups = [s.add([*system, 200 + i, 300 + i], 1, 4) for i in range(3)]
    plan = s.schedule()
    # Only the first computes the shared prefix; the others wait for it.
    assert [it.stream for it in plan.items] == [groups[0].streams[0]]
    sample_all(s, plan, 7)
    s.kv.take()
    plan = s.schedule()
    leader = groups[0].streams[0]
    assert s.kv.take() == [("share", leader.seq, g.streams[0].seq, 50) for g in groups[1:]]
    # Each follower computes only its own two tokens.
    follower_items = [it for it in plan.items if it.stream is not leader]
    assert [(it.tokens, it.pos0) for it in follower_items] == [([201, 301], 50), ([202, 302], 50)]
    assert s.prompt_tokens_cached == 100


def test_a_live_prefix_only_a_few_tokens_past_the_tiers_is_not_waited_for():
    """Defect: a request waited a whole step for a running stream to compute three tokens past the prefix the
    tiers held (a chat's new tag after a cached system prompt), then copied that stream's whole KV stream
    (47 MB at 2,048 cells of SmolLM2): TTFT p50 at 4 chat streams 232 ms against llama-server's 212."""
    s = make(streams=4, budget=64)
    system = list(range(100, 150))  # 50 tokens, in the tiers
    s.kv.save(0, system)
    s.kv.take()
    groups = [s.add([*system, 1, 2, 3, 200 + i, 300 + i], 1, 4) for i in range(3)]  # 1, 2, 3: new to all
    plan = s.schedule()
    assert [it.stream for it in plan.items] == [g.streams[0] for g in groups]  # nobody waits
    assert [c[0] for c in s.kv.take()] == ["restore"] * 3
    assert [(it.tokens, it.pos0) for it in plan.items] == [([1, 2, 3, 200 + i, 300 + i], 50) for i in range(3)]


def test_a_live_prefix_well_past_the_tiers_is_waited_for():
    s = make(streams=4, budget=64)
    system = list(range(100, 150))
    s.kv.save(0, system[:20])  # the tiers hold 20 of the 50 shared tokens
    s.kv.take()
    groups = [s.add([*system, 200 + i, 300 + i], 1, 4) for i in range(2)]
    plan = s.schedule()
    assert [it.stream for it in plan.items] == [groups[0].streams[0]]  # the other waits for 30 more tokens
    sample_all(s, plan, 7)
    s.kv.take()
    s.schedule()
    assert s.kv.take() == [("share", groups[0].streams[0].seq, groups[1].streams[0].seq, 50)]


def test_kept_conversations_resume_beside_a_live_prefix_only_a_few_tokens_longer():
    s = keeping()
    system = list(range(1, 41))
    first = [s.add([*system, 50 + i], 1, 1).streams[0] for i in range(2)]  # two conversations at once
    run_step(s)  # the first computes the system prompt, the second then copies it
    plan = s.schedule()
    s.postprocess(plan, [StepOutput(st, [21], status=Status.LENGTH) for st in first])
    s.retire_ended()
    kept = sorted(st.seq for st in first)
    assert sorted(s.kept) == kept
    s.kv.take()
    groups = [s.add([*system, 90, 91, 92, 60 + i], 1, 3) for i in range(2)]  # 90..92: new to both
    plan = s.schedule()
    assert [it.stream for it in plan.items] == [g.streams[0] for g in groups]  # both in this step...
    assert sorted(it.stream.seq for it in plan.items) == kept  # ...each in a kept sequence, in place
    assert s.resumed_in_place == 2 and not any(c[0] == "share" for c in s.kv.take())


def test_full_prompt_hit_recomputes_the_last_token():
    s = make()
    s.kv.save(0, list(range(1, 31)))
    s.add(list(range(1, 31)), 1, 2)
    plan = s.schedule()
    assert plan.items[0].tokens == [30] and plan.items[0].pos0 == 29


def test_unified_cache_waits_for_cells_and_per_sequence_streams_only_for_a_sequence():
    s = make(n_ctx=100, streams=4)
    a = s.add([1] * 30, 1, 30)  # reserves 60 of 100
    b = s.add([2] * 20, 1, 30)  # needs 50: waits
    s.schedule()
    assert a.streams[0].status == Status.RUNNING and b.streams[0].status == Status.WAITING
    per_seq = make(n_ctx=100, streams=4, cells_per_seq=25)
    groups = [per_seq.add([k] * 10, 1, 15) for k in range(4)]  # each fits its own 25-cell stream
    per_seq.schedule()
    assert all(g.streams[0].status == Status.RUNNING for g in groups)
    assert per_seq.cells_used == 4 * 25


def test_a_sequence_in_a_copy_that_has_not_landed_is_neither_saved_nor_reused():
    """With a KV stream per sequence, llama.cpp moves the bytes of a copy at the next decode: a state
    saved before then would hold stale bytes, and bytes written into the copy's source or target
    before then would be overwritten by the copy."""
    s = make(streams=2, cells_per_seq=500)
    system = list(range(100, 150))
    leader = s.add([*system, 1], 1, 4).streams[0]
    follower = s.add([*system, 2], 1, 4).streams[0]
    sample_all(s, s.schedule())  # the leader computes the prefix
    s.schedule()  # the follower copies it
    assert ("share", leader.seq, follower.seq, 50) in s.kv.take()
    s.cancel(follower)
    s.schedule()  # before any decode: the follower ends
    assert not any(c[0] == "save" for c in s.kv.calls)  # its bytes have not landed: nothing saved
    assert follower.seq not in s.free_seqs  # and its sequence waits for the decode
    s.postprocess(s.schedule(), [])
    assert follower.seq in s.free_seqs


def test_when_a_group_leader_ends_before_the_prompt_is_computed_a_fork_takes_over():
    """Defect: the forks waited for a leader that was gone, were never scheduled, and the engine spun."""
    s = make(budget=64)
    g = s.add([5, 6, 7, 8], 3, 4)
    s.schedule()
    leader, a, b = g.streams
    s.cancel(leader)
    plan = s.schedule()
    assert plan.finished == [leader]
    assert [it.stream for it in plan.items] == [a] and plan.items[0].tokens == [5, 6, 7, 8]
    assert plan.items[0].samplers == [a, b]  # the new leader's last prompt row starts the other fork too
    sample_all(s, plan, 9)
    assert not a.fork_pending and not b.fork_pending and a.n_generated == b.n_generated == 1


def test_a_preempted_stream_waits_for_room_then_resumes_where_it_was():
    s = make(n_ctx=200, streams=3, budget=64)
    a = s.add(list(range(1, 21)), 1, 40).streams[0]
    b = s.add(list(range(30, 50)), 1, 40).streams[0]
    run_step(s, 7)
    run_step(s, 8)  # both decoded a token; each has 20 prompt + 1 token in its KV and 8 pending
    s.kv.take()
    seq = b.seq
    s.preempt(b)
    assert s.kv.take() == [("save", seq, [*range(30, 50), 7]), ("rm", seq, 0)]
    assert b.status == Status.WAITING and b.tokens == [*range(30, 50), 7, 8] and b.n_computed == 0
    assert s.waiting[0].streams == [b] and s.cells_used == 60
    plan = s.schedule()
    assert [it.stream for it in plan.items] == [a]  # no stream has ended yet: b waits
    s.finish(a, Status.STOPPED)
    s.kv.take()
    plan = s.schedule()
    key = next(k for k, t in s.kv.saved.items() if t == [*range(30, 50), 7])
    assert s.kv.take() == [("restore", key, b.seq, 21)]
    assert [(it.stream, it.tokens, it.pos0) for it in plan.items] == [(b, [8], 21)]  # exactly where it was
    assert b.n_generated == 2 and s.preemptions == 1


def test_batch_items_go_in_increasing_sequence_order_and_the_lowest_free_sequence_is_reused():
    """llama.cpp computes a KV stream per sequence in one pass only for consecutive increasing ids."""
    s = make(streams=3, cells_per_seq=300)
    a, _b, _c = (s.add([k] * 20, 1, 50).streams[0] for k in (1, 2, 3))
    run_step(s)
    s.finish(a, Status.STOPPED)
    d = s.add([4] * 20, 1, 50).streams[0]
    plan = s.schedule()
    assert d.seq == 0  # a's sequence, the lowest free one
    assert [it.stream.seq for it in plan.items] == [0, 1, 2]  # d's prompt chunk first, by sequence


def keeping(streams=4):
    """A scheduler that keeps finished conversations in their sequences (one KV stream per sequence)."""
    return Scheduler(FakeKv(per_seq=True), streams * 300, streams, 64, 300, keep_finished=True)


def finished_turn(s, prompt, answer=(21,)):
    """Run a request to its end: its prompt, then `answer` sampled; returns its (ended, retired) stream."""
    g = s.add(prompt, 1, len(answer))
    for i, t in enumerate(answer):
        plan = s.schedule()
        last = i == len(answer) - 1
        s.postprocess(plan, [StepOutput(g.streams[0], [t], status=Status.LENGTH if last else None)])
    s.retire_ended()
    return g.streams[0]


def test_a_finished_conversation_stays_in_its_sequence_and_its_next_turn_goes_on_there():
    """Defect: every turn copied its KV out to the RAM tier at its end and back at the next turn (9.5 + 5.9 ms
    for 1k tokens of SmolLM2, 2% of a 48-token answer at one stream), where llama-server's slot keeps it."""
    s = keeping()
    prompt = list(range(1, 21))
    s.kv.take()
    st = finished_turn(s, prompt, (21, 22))
    assert s.kv.take() == [] and st.seq in s.kept and st.seq not in s.free_seqs  # nothing copied, nothing freed
    assert not s.has_work()
    g2 = s.add([*prompt, 21, 22, 23, 24], 1, 3)  # the next turn: the kept tokens (1..21) are its prefix
    plan = s.schedule()
    new = g2.streams[0]
    assert new.seq == st.seq and s.kv.take() == [("rm", st.seq, 21)]  # no save, no restore
    assert new.n_cached == 21 and plan.items[0].tokens == [22, 23, 24] and plan.items[0].pos0 == 21
    assert s.prompt_tokens_cached == 21 and s.resumed_in_place == 1 and not s.kept


def test_a_new_conversation_takes_a_free_sequence_and_leaves_the_kept_one():
    s = keeping()
    a = finished_turn(s, list(range(1, 21)))
    s.kv.take()
    g = s.add(list(range(100, 130)), 1, 3)
    s.schedule()
    assert g.streams[0].seq != a.seq and a.seq in s.kept and s.kv.take() == []


def test_a_kept_sequence_is_saved_to_the_tiers_when_its_sequence_is_wanted():
    s = keeping(streams=2)
    a = finished_turn(s, list(range(1, 21)))
    b = finished_turn(s, list(range(30, 50)))
    assert sorted(s.kept) == [a.seq, b.seq] and not s.free_seqs
    s.kv.take()
    g = s.add(list(range(100, 130)), 1, 3)  # no sequence free: the least recently kept one goes to the tiers
    s.schedule()
    assert g.streams[0].seq == a.seq and list(s.kept) == [b.seq]
    assert s.kv.take() == [("save", a.seq, list(range(1, 21))), ("rm", a.seq, 0)]
    # ...where the next turn of that conversation finds it.
    s.finish(g.streams[0], Status.CANCELLED)
    s.add([*range(1, 21), 7, 8], 1, 3)
    s.schedule()
    assert ("restore", 0, a.seq, 20) in s.kv.take()


def test_a_kept_conversation_resumes_in_place_only_where_the_running_sequences_stay_consecutive():
    """llama.cpp decodes one KV stream per sequence in one pass only over consecutive ids: a turn resumed in a
    kept sequence apart from the running ones would split every step in two for its whole answer."""
    s = keeping(streams=4)
    finished_turn(s, [1] * 20)  # kept in sequence 0 (its 20 prompt tokens)
    running = [s.add([k] * 20, 1, 50).streams[0] for k in (2, 3)]
    run_step(s)
    assert [r.seq for r in running] == [1, 2]
    s.finish(running[0], Status.STOPPED)  # kept in sequence 1: running {2}
    late = s.add([4] * 20, 1, 50).streams[0]
    s.schedule()
    assert late.seq == 3 and sorted(s.kept) == [0, 1]  # running {2, 3}; a free sequence before a kept one
    s.kv.take()
    g = s.add([1] * 20 + [21, 5], 1, 3)  # a's next turn: sequence 0 would leave {0} apart from {2, 3}
    s.schedule()
    new = g.streams[0]
    assert new.seq == 1 and s.resumed_in_place == 0 and list(s.kept) == [0]
    calls = s.kv.take()
    # a's KV to the tiers (it stays kept, saved), sequence 1's conversation too, then a's restored next to them.
    assert calls == [("save", 0, [1] * 20), ("save", 1, [2] * 20), ("rm", 1, 0), ("restore", 0, 1, 20)]
    assert s.kept[0].saved


def test_a_burst_of_returning_conversations_resumes_in_place_in_any_order_of_arrival():
    """Defect: each turn was judged alone against the streams already running, so in a burst of returning agents
    (edgeinfer bench --workload multi-agent, warm run at 16 streams) the second to arrive found its sequence apart
    from the first and was saved to the tiers and restored elsewhere, evicting another kept conversation: of 48
    warm requests 5 resumed in place and 43 were restored, 140-160 ms of the engine's time before a step."""
    s = keeping(streams=4)
    prompts = {k: [k] * 20 for k in (1, 2, 3, 4)}
    for k in (1, 2, 3, 4):
        finished_turn(s, prompts[k])
    seq_of = {k: seq for seq, kept in s.kept.items() for k in prompts if kept.tokens[:20] == prompts[k]}
    s.kv.take()
    order = sorted(prompts, key=lambda k: (seq_of[k] * 3) % 4)  # the agents come back out of sequence order
    groups = {k: s.add([*prompts[k], 21, 9, k], 1, 3) for k in order}
    s.schedule()
    assert {k: g.streams[0].seq for k, g in groups.items()} == seq_of and s.resumed_in_place == 4
    assert not any(c[0] in ("save", "restore") for c in s.kv.take())


def test_a_kept_conversation_that_is_mostly_another_one_is_saved_before_it_is_cut():
    s = keeping(streams=1)
    system = list(range(1, 21))
    finished_turn(s, [*system, *range(100, 160)])  # a long conversation after a shared system prompt
    s.kv.take()
    g = s.add([*system, 7, 8], 1, 3)  # a new one sharing only the system prompt
    s.schedule()
    calls = s.kv.take()
    assert calls[0][0] == "save" and calls[-1] == ("rm", g.streams[0].seq, 20)


def test_forgotten_kept_conversations_are_freed_on_the_engine_thread_and_none_resumes():
    s = keeping()
    a = finished_turn(s, list(range(1, 21)))
    s.kv.take()
    s.forget_kept()
    assert not s.kept and s.has_work() and s.kv.take() == []  # nothing touched off the engine thread
    s.retire_ended()
    assert s.kv.take() == [("rm", a.seq, 0)] and a.seq in s.free_seqs and not s.has_work()


def test_release_kept_saves_every_kept_conversation_and_frees_its_sequence():
    s = keeping()
    a = finished_turn(s, list(range(1, 21)))
    b = finished_turn(s, list(range(30, 50)))
    s.kv.take()
    s.release_kept(save=True)
    assert [c[:2] for c in s.kv.take() if c[0] == "save"] == [("save", a.seq), ("save", b.seq)]
    assert not s.kept and sorted(s.free_seqs) == [0, 1, 2, 3]


def test_a_unified_cache_keeps_nothing_in_its_cells():
    s = Scheduler(FakeKv(), 1000, 4, 64, None, keep_finished=True)
    st = finished_turn(s, list(range(1, 21)))
    assert not s.kept and st.seq in s.free_seqs


def test_a_kept_conversation_that_cannot_be_saved_costs_only_its_own_cold_start():
    class FullKv(FakeKv):
        def save(self, seq, tokens):
            raise MemoryError("no memory for the copy")

    s = Scheduler(FullKv(per_seq=True), 300, 1, 64, 300, keep_finished=True)
    finished_turn(s, list(range(1, 21)))
    g = s.add(list(range(100, 130)), 1, 3)  # wants the only sequence: the kept one's save fails
    plan = s.schedule()
    assert plan.items[0].stream is g.streams[0] and s.lost_saves == 1 and not s.kept


def test_with_a_disk_tier_a_kept_conversation_is_also_saved_as_it_ends_and_not_again_when_its_sequence_goes():
    """Defect: a kept conversation reached the tiers only when its sequence was wanted or at close, so with
    --cache-dir a crash (or a kill) lost every turn of it since; `chat --resume` then started cold."""
    s = Scheduler(FakeKv(per_seq=True), 600, 2, 64, 300, keep_finished=True, write_through=True)
    s.kv.take()
    a = finished_turn(s, list(range(1, 21)))
    assert s.kv.take() == [("save", a.seq, list(range(1, 21)))] and a.seq in s.kept  # saved, and kept in place
    finished_turn(s, list(range(30, 50)))
    s.kv.take()
    s.add(list(range(100, 130)), 1, 3)  # a's sequence is wanted: already saved, it is only dropped
    s.schedule()
    assert s.kv.take() == [("rm", a.seq, 0)]
