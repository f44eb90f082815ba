"""What the engine does when something breaks: a step fails, the KV cache is full, drafting breaks,
the engine thread dies, or llama.cpp aborts (with RPC workers: one stopped answering)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from edgeinfer.engine.scheduler import Status, StepPlan
from edgeinfer.errors import EdgeInferError, EngineFailedError
from edgeinfer.llamacpp.rpc import workers_down

if TYPE_CHECKING:
    from edgeinfer.engine.engine import Engine


def die(eng: Engine, error: BaseException) -> None:
    """The engine thread cannot go on: every request ends with the reason, and new ones are refused."""
    reason = f"{type(error).__name__}: {error}" if not isinstance(error, EdgeInferError) else str(error)
    with eng._lock:
        end_everything(eng, reason)
    with contextlib.suppress(Exception):
        eng.delivery.outbox.flush()


def aborted(eng: Engine, reason: str) -> None:
    """llama.cpp aborted (with workers: one stopped answering). The failed thread calls this, then stays
    parked, and so may the engine thread, perhaps holding the lock: nothing here waits on it for long."""
    reason = f"{workers_down(eng.config.rpc_endpoints)}llama.cpp: {reason}"
    eng.fatal_error = reason  # submit reads it before taking the lock
    locked = eng._lock.acquire(timeout=2.0)
    try:
        end_everything(eng, reason)
    finally:
        if locked:
            eng._lock.release()
    with contextlib.suppress(Exception):
        eng.delivery.outbox.flush()


def end_everything(eng: Engine, reason: str) -> None:
    eng.fatal_error = reason
    eng._closing = True
    for live in list(eng.delivery.live.values()):
        live.stream.status = Status.ERROR
        with contextlib.suppress(Exception):
            eng.delivery.finish(live.stream, error=f"the engine stopped ({reason}); restart it")
    for _, fut in eng._exclusive:
        fut.set_exception(EngineFailedError(f"the engine stopped: {reason}"))
    eng._exclusive.clear()


def drafter_failed(eng: Engine, error: BaseException) -> None:
    """Drafting broke (e.g. the draft context is full): go on without speculation."""
    with eng._lock:  # submit() and the Finish path read eng.spec under the lock
        spec, eng.spec = eng.spec, None
        eng.spec_error = str(error)
    if spec is not None:
        spec.close()


def kv_full(eng: Engine, plan: StepPlan) -> None:
    """llama.cpp found no room for the batch: nothing of it entered the KV cache. The youngest stream is
    preempted (its KV saved, its text kept) and resumes once another ends; alone, it cannot go on."""
    with eng._lock:
        youngest = max((it.stream for it in plan.items), key=lambda s: s.id)
        if len(eng.sched.running) > 1:
            eng.sched.preempt(youngest)
        else:
            eng.sched.finish(youngest, Status.ERROR)
            eng._finish_event(youngest, "the KV cache has no room for this stream; raise --ctx-size")


def fail_all(eng: Engine, error: BaseException) -> None:
    """A step failed: end every running stream with the error; the engine keeps serving."""
    message = str(error) if isinstance(error, EdgeInferError) else f"internal error: {error!r}"
    with eng._lock:
        for s in list(eng.sched.running):
            eng.sched.finish(s, Status.ERROR)
            eng._finish_event(s, message)
