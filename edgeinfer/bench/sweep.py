"""The concurrency sweep: every target runs the same workload at each level, side by side.

At each level, each repeat runs a pair per target, targets taking turns so that drift in
the machine's speed falls on all of them alike, the first of a repeat going last in the next
(in a fixed order one target always ran straight after the same other one: whatever that one
leaves behind, a server's threads still spinning or the machine's load, fell on it alone):

- a cold run: every conversation opens with a tag new to this run, so no cached prefix
  matches (the streams of the run still share the rest of their prompt with each other);
- a warm run straight after: the same opening, with a new tag just before each stream's
  own part, so the shared prefix the cold run computed can be reused (the agent's system
  prompt, the long document).

The best run of the repeats is kept for each, by aggregate tok/s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from edgeinfer.bench.knee import Knee, find_knee
from edgeinfer.bench.results import RunResult, best
from edgeinfer.bench.targets import Target
from edgeinfer.bench.workloads import messages


class Progress(Protocol):
    def begin(self, label: str) -> None: ...

    def advance(self) -> None: ...

    def remaining(self, n: int) -> None:
        """Streams still to finish, once the work ahead is known (tuning)."""


class SayProgress:
    """Progress as one line per run, for callers that show text (the dashboard, plain logs)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def begin(self, label: str) -> None:
        self.say(label)

    def advance(self) -> None:
        pass

    def remaining(self, n: int) -> None:
        pass


@dataclass(slots=True)
class Side:
    """One target at one level: its best cold and warm runs."""

    cold: RunResult
    warm: RunResult


@dataclass(slots=True)
class Level:
    concurrency: int
    sides: dict[str, Side]  # by target name


@dataclass(slots=True)
class Sweep:
    workload: str
    max_tokens: int
    repeats: int
    targets: list[Target]
    levels: list[Level] = field(default_factory=list)

    def series(self, name: str) -> list[Side]:
        return [lv.sides[name] for lv in self.levels]

    def knee(self, name: str) -> Knee | None:
        """Where this target's aggregate tok/s flattens while TTFT p95 keeps rising (warm runs)."""
        if len(self.levels) < 2:
            return None
        sides = self.series(name)
        return find_knee(
            [lv.concurrency for lv in self.levels], [s.warm.total_tps for s in sides], [s.warm.ttft(95) for s in sides]
        )


def runs_in(levels: list[int], repeats: int, n_targets: int) -> int:
    """Streams a sweep will finish, warm-up included (the progress bar's total)."""
    return n_targets * (1 + 2 * repeats * sum(levels))


def run_sweep(
    targets: list[Target], workload: str, levels: list[int], max_tokens: int, repeats: int, progress: Progress
) -> Sweep:
    sweep = Sweep(workload, max_tokens, repeats, targets)
    for t in targets:  # load weights, warm caches and thread pools; not measured
        progress.begin(f"{t.name}: warm-up")
        t.run(messages(workload, 1, head="warm-up. "), min(8, max_tokens), progress.advance)
    indexed = list(enumerate(targets))  # k: the target's own index, in its runs' tags whatever the turn
    for c in levels:
        cold: dict[str, RunResult | None] = dict.fromkeys((t.name for t in targets), None)
        warm = dict(cold)
        for i in range(repeats):
            turn = i % len(targets)
            for k, t in indexed[turn:] + indexed[:turn]:
                head = f"[run {c}.{i}.{k}] "  # new to this run and this target: nothing before it matches
                progress.begin(f"{c} streams, {t.name}: cold run {i + 1}/{repeats}")
                cold[t.name] = best(cold[t.name], t.run(messages(workload, c, head=head), max_tokens, progress.advance))
                progress.begin(f"{c} streams, {t.name}: warm run {i + 1}/{repeats}")
                msgs = messages(workload, c, tag="(again) ", head=head)
                warm[t.name] = best(warm[t.name], t.run(msgs, max_tokens, progress.advance))
        sides = {}
        for t in targets:
            c_run, w_run = cold[t.name], warm[t.name]
            assert c_run is not None and w_run is not None
            sides[t.name] = Side(c_run, w_run)
        sweep.levels.append(Level(c, sides))
    return sweep
