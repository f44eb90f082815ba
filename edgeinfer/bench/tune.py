"""`edgeinfer bench --tune`: find the settings that serve this machine best, and save them.

1. A concurrency sweep with the starting settings finds the knee: that is `parallel`
   (the largest level tried when throughput still rises there).
2. Then one setting at a time (threads, batch size, KV cache type and layout, speculation), each
   candidate value runs the workload at `parallel` streams; the best value is kept
   before the next setting is tried (coordinate descent, a handful of runs each).

A value replaces the current one only when it is faster by more than a margin, so noise
does not move settings, and a lossy KV cache type must earn its place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.bench.knee import Knee
from edgeinfer.bench.results import RunResult, best
from edgeinfer.bench.sweep import Progress, run_sweep
from edgeinfer.bench.targets import EngineTarget
from edgeinfer.bench.workloads import messages
from edgeinfer.engine.offload import offloads
from edgeinfer.options import EngineConfig, usable_cores

MARGIN = 0.05  # a new value must be this much faster than the current one (noise here is about ±3%)


@dataclass(slots=True)
class Trial:
    setting: str
    value: Any
    tps: float  # aggregate tok/s at the tuned parallel


@dataclass(slots=True)
class Tuning:
    parallel: int
    knee_reason: str
    chosen: dict[str, Any]  # the settings to save
    tps: float  # the chosen settings' aggregate tok/s
    trials: list[Trial] = field(default_factory=list)


def choose(current: Any, trials: list[Trial], margin: float = MARGIN) -> Trial:
    """The trial to keep: the fastest, unless it beats the current value's trial by no more than margin."""
    if not trials:
        raise ValueError("no trials to choose from")
    incumbent = next((t for t in trials if t.value == current), None)
    fastest = max(trials, key=lambda t: t.tps)
    if incumbent is None or fastest.tps > incumbent.tps * (1 + margin):
        return fastest
    return incumbent


def candidates(config: EngineConfig, cpus: int | None = None) -> dict[str, list[Any]]:
    """The values tried for each setting, the current one first."""
    cpus = cpus or usable_cores()
    threads = sorted({cpus, max(1, cpus // 2), max(1, cpus - 1)}, reverse=True)
    return {
        "threads": threads,
        "batch_size": [512, 1024, 2048] if offloads(config) else [512, 256, 1024],
        "kv_type": ["f16", "q8_0"],
        "kv_layout": ["per-seq", "unified"],
        "spec": ["off", "auto"],
    }


def tune(
    base: EngineConfig,
    find_parallel: Callable[[EngineConfig], Knee],
    measure: Callable[[EngineConfig], float],
    progress: Progress,
    repeats: int = 1,
) -> Tuning:
    """Find parallel from the knee, then settle each setting in turn; returns what to save.

    find_parallel(config) runs the concurrency sweep; measure(config) gives aggregate tok/s
    at config.parallel streams (the benchmark passes real runs, the tests synthetic curves).
    """
    knee = find_parallel(base.replace(spec="off"))
    parallel = knee.parallel
    config = base.replace(parallel=parallel, batch_size=max(base.batch_size, parallel), spec="off")
    cpus = usable_cores()
    current: dict[str, Any] = {
        "threads": config.threads or cpus,
        "batch_size": config.batch_size,
        "kv_type": config.kv_type,
        "kv_layout": config.kv_layout,
        "spec": "off",
    }
    plan = candidates(config, cpus)
    progress.remaining(sum(len(v) + 1 for v in plan.values()) * (1 + repeats) * parallel)
    trials: list[Trial] = []
    best_tps = 0.0
    for setting, values in plan.items():
        if current[setting] not in values:
            values = [current[setting], *values]
        batch = []
        for v in values:
            trial_config = config.replace(**{**current, setting: v})
            trial_config.threads_batch = trial_config.threads
            progress.begin(f"tuning {setting}: {v} at {parallel} streams")
            batch.append(Trial(setting, v, measure(trial_config)))
        trials.extend(batch)
        pick = choose(current[setting], batch)
        current[setting] = pick.value
        best_tps = pick.tps
    chosen = {"parallel": parallel, **current}
    if chosen["threads"] == cpus:
        chosen["threads"] = 0  # all cores, wherever the file is read
    return Tuning(parallel, knee.reason, chosen, best_tps, trials)


def measured_tune(
    base: EngineConfig,
    workload: str,
    levels: list[int],
    max_tokens: int,
    repeats: int,
    progress: Progress,
) -> Tuning:
    """tune() on real runs of the workload."""
    from edgeinfer.runtime import make_engine

    def find_parallel(config: EngineConfig) -> Knee:
        config = config.replace(parallel=max(levels), batch_size=max(config.batch_size, max(levels)))
        engine = make_engine(config)
        try:
            sweep = run_sweep([EngineTarget(engine)], workload, levels, max_tokens, repeats, progress)
        finally:
            engine.close()
        return sweep.knee("edgeinfer") or Knee(levels[0], False, None, "a single level")

    def measure(config: EngineConfig) -> float:
        """Aggregate tok/s of the best warm run at config.parallel streams with these settings."""
        n = config.parallel
        engine = make_engine(config)
        try:
            target = EngineTarget(engine)
            # Two tokens per stream compute the shared prefix and warm the thread pool; then the measured runs.
            target.run(messages(workload, n, head="[tune] "), 2, progress.advance)
            top: RunResult | None = None
            for i in range(repeats):
                top = best(
                    top, target.run(messages(workload, n, f"(again {i}) ", "[tune] "), max_tokens, progress.advance)
                )
            assert top is not None
            return top.total_tps
        finally:
            engine.close()

    return tune(base, find_parallel, measure, progress, repeats)


def tune_runs(levels: list[int], repeats: int) -> int:
    """Streams a tuning will finish (the progress bar's total), guessing parallel as the largest level."""
    n_trials = sum(len(v) for v in candidates(EngineConfig()).values())
    sweep = 1 + 2 * repeats * sum(levels)
    return sweep + n_trials * (1 + repeats) * max(levels)
