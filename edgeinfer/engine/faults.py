"""What the engine does when something breaks: a step fails, the KV cache is full, the engine thread dies,
or llama.cpp aborts (with RPC workers: one stopped answering).

The policies are functions over `Host`, the few things they ask of the engine, so that they read
nothing else of it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Protocol

from edgeinfer.engine.scheduler import Scheduler
from edgeinfer.engine.step import StepPlan
from edgeinfer.engine.stream import Status, Stream
from edgeinfer.errors import EdgeInferError
from edgeinfer.llamacpp.rpc import workers_down
from edgeinfer.options import EngineConfig


class Host(Protocol):
    """What fault handling asks of the engine (edgeinfer.engine.engine.Engine is one)."""

    config: EngineConfig
    sched: Scheduler
    lock: threading.Lock  # the engine's one lock, guarding the scheduler and the streams' callers
    fatal_error: str | None  # why the engine stopped; submit() reads it before taking the lock

    def stop(self, reason: str) -> None:
        """Refuse new work; every stream and the work queued between steps end with the reason (lock held)."""

    def end_stream(self, s: Stream, status: Status, error: str | None = None) -> None:
        """End a running stream, in the scheduler and for its caller (lock held)."""

    def deliver(self) -> None:
        """Hand the queued events to their asyncio loops, without taking the lock."""


def die(eng: Host, error: BaseException) -> None:
    """The engine thread cannot go on: every request ends with the reason, and new ones are refused."""
    reason = f"{type(error).__name__}: {error}" if not isinstance(error, EdgeInferError) else str(error)
    with eng.lock:
        eng.stop(reason)
    with contextlib.suppress(Exception):
        eng.deliver()


def aborted(eng: Host, reason: str) -> None:
    """llama.cpp aborted (with workers: one stopped answering). The failed thread calls this, then stays
    parked, and so may the engine thread, perhaps holding the lock: nothing here waits on it for long."""
    reason = f"{workers_down(eng.config.rpc_endpoints)}llama.cpp: {reason}"
    eng.fatal_error = reason  # submit reads it before taking the lock
    locked = eng.lock.acquire(timeout=2.0)
    try:
        eng.stop(reason)
    finally:
        if locked:
            eng.lock.release()
    with contextlib.suppress(Exception):
        eng.deliver()


def kv_full(eng: Host, plan: StepPlan) -> None:
    """llama.cpp found no room for the batch: nothing of it entered the KV cache. The youngest stream is
    preempted (its KV saved, its text kept) and resumes once another ends; alone, it cannot go on."""
    with eng.lock:
        youngest = max((it.stream for it in plan.items), key=lambda s: s.id)
        if len(eng.sched.running) > 1:
            eng.sched.preempt(youngest)
        else:
            eng.end_stream(youngest, Status.ERROR, "the KV cache has no room for this stream; raise --ctx-size")


def fail_all(eng: Host, error: BaseException) -> None:
    """A step failed: end every running stream with the error; the engine keeps serving."""
    message = str(error) if isinstance(error, EdgeInferError) else f"internal error: {error!r}"
    with eng.lock:
        for s in list(eng.sched.running):
            eng.end_stream(s, Status.ERROR, message)
