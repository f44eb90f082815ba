"""The benchmark's own use of an engine's thread: a function run on it while no stream runs, and speculation on or off.

A baseline that drives llama.cpp directly (the raw loop, the quality check's forced decode) runs
on the engine's context and the engine's OS thread, so that both share one set of compute
threads; it runs between two steps, once the engine has no stream (its KV cells are then empty).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from edgeinfer.engine.engine import Engine
    from edgeinfer.llamacpp import Context

R = TypeVar("R")


class Exclusive(Generic[R]):
    """One call of fn(ctx) on the engine thread while the engine is idle: work between steps (engine.BetweenSteps)."""

    def __init__(self, engine: Engine, fn: Callable[[Context], R]) -> None:
        self.engine = engine
        self.queue: deque[Callable[[Context], R]] = deque([fn])
        self.future: Future[R] = Future()

    def pending(self) -> bool:
        return bool(self.queue)

    def run_pending(self) -> None:
        if not self.queue or not self.engine.is_idle():
            return  # streams first: it runs once they have all ended
        fn = self.queue.popleft()
        try:
            self.future.set_result(fn(self.engine.ctx))
        except BaseException as e:
            self.future.set_exception(e)

    def fail(self, error: BaseException) -> None:
        if self.queue:
            self.queue.clear()
            self.future.set_exception(error)


def run_exclusive(engine: Engine, fn: Callable[[Context], R]) -> R:
    """fn(ctx) on the engine's thread and context, while no stream runs; EngineClosedError once it closes."""
    work = Exclusive(engine, fn)
    engine.add_between_steps(work)
    try:
        return work.future.result()
    finally:
        engine.remove_between_steps(work)


def set_speculation(engine: Engine, on: bool) -> None:
    """Draft or not from the next step on, to compare both on one engine (nothing to switch without a speculator)."""
    if engine.speculator is not None:
        engine.speculator.enabled = on
