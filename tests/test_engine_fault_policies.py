"""The fault policies (engine/faults.py) over a stand-in for the engine: they need only faults.Host.

No model: a real Scheduler over a fake KV cache, and a host that records what the policies ask of it.
The same policies on the real engine are tested in test_engine_faults.py.
"""

from __future__ import annotations

import threading

import pytest

from edgeinfer.engine import faults
from edgeinfer.engine.scheduler import Scheduler, Status
from edgeinfer.engine.stream import Stream
from edgeinfer.errors import RequestError
from edgeinfer.options import EngineConfig

from .test_scheduler import FakeKv

pytestmark = pytest.mark.pure


class FakeHost:
    """faults.Host, recording each call."""

    def __init__(self, n_streams: int) -> None:
        self.config = EngineConfig.model_construct(rpc_endpoints=[])
        self.sched = Scheduler(FakeKv(), 1000, 4, 64)
        self.lock = threading.Lock()
        self.fatal_error: str | None = None
        self.ended: list[tuple[int, Status, str | None]] = []
        self.stopped: list[str] = []
        self.delivered = 0
        for i in range(n_streams):
            self.sched.add([100 * (i + 1) + t for t in range(20)], 1, 8)  # prompts sharing no prefix
        self.plan = self.sched.schedule()

    def stop(self, reason: str) -> None:
        assert self.lock.locked()
        self.stopped.append(reason)

    def end_stream(self, s: Stream, status: Status, error: str | None = None) -> None:
        assert self.lock.locked()
        self.sched.finish(s, status)
        self.ended.append((s.id, status, error))

    def deliver(self) -> None:
        self.delivered += 1


def test_a_full_kv_cache_preempts_the_youngest_of_several_streams():
    host = FakeHost(3)
    assert [it.stream.id for it in host.plan.items] == [0, 1, 2]
    faults.kv_full(host, host.plan)
    assert host.ended == [] and host.sched.preemptions == 1
    assert [s.id for s in host.sched.running] == [0, 1]
    assert host.sched.waiting[0].streams[0].id == 2  # back at the front of the queue


def test_a_full_kv_cache_ends_a_stream_alone_with_an_error_naming_the_fix():
    host = FakeHost(1)
    faults.kv_full(host, host.plan)
    assert host.sched.preemptions == 0
    assert [(i, st) for i, st, _ in host.ended] == [(0, Status.ERROR)] and "--ctx-size" in (host.ended[0][2] or "")


def test_a_failed_step_ends_every_running_stream_with_its_message():
    host = FakeHost(2)
    faults.fail_all(host, RequestError("bad", "x"))
    faults.fail_all(host, RuntimeError("boom"))  # nothing left running: nothing more ends
    assert host.ended == [(0, Status.ERROR, "bad"), (1, Status.ERROR, "bad")]
    assert host.sched.running == [] and not host.lock.locked()


def test_a_dead_engine_thread_stops_the_engine_with_the_reason():
    host = FakeHost(1)
    faults.die(host, RuntimeError("scheduler bug"))
    assert host.stopped == ["RuntimeError: scheduler bug"] and host.delivered == 1


def test_an_abort_stops_the_engine_even_while_a_parked_thread_holds_the_lock():
    host = FakeHost(1)
    host.lock.acquire()  # the engine thread, parked inside llama.cpp for good
    host.stop = lambda reason: host.stopped.append(reason)  # type: ignore[method-assign]
    faults.aborted(host, "GGML_ASSERT failed")
    assert host.fatal_error == "llama.cpp: GGML_ASSERT failed" and host.stopped == [host.fatal_error]
    assert host.delivered == 1 and host.lock.locked()  # it did not release a lock it does not hold
