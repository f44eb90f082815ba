"""`edgeinfer bench` (first version): engine against the raw loop, at each concurrency."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgeinfer.bench.rawloop import run_raw
from edgeinfer.bench.stats import RunResult, StreamResult, best
from edgeinfer.bench.workloads import messages, prompts
from edgeinfer.engine import Engine
from edgeinfer.params import SamplingParams


@dataclass(slots=True)
class LevelResult:
    """Engine and raw loop at one concurrency, best of the repeats."""

    concurrency: int
    engine: RunResult
    raw: RunResult

    def as_dict(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "engine": self.engine.figures(),
            "raw": self.raw.figures(),
            "engine_over_raw": round(self.engine.decode_tps / self.raw.decode_tps, 3) if self.raw.decode_tps else None,
        }


def chat_prompts(engine: Engine, n: int) -> list[list[int]]:
    return prompts(engine, "chat", n)


def run_engine(engine: Engine, prompts: list[list[int]], max_tokens: int, reset: bool = True) -> RunResult:
    """Submit every prompt at once; greedy, exactly max_tokens each (end-of-text ignored)."""
    if reset:
        engine.reset_prefixes()  # no reuse across runs: the raw loop has none either
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t_start = time.perf_counter()
    handles = [engine.submit(p, params)[0] for p in prompts]
    finishes = [h.result() for h in handles]
    t_end = time.perf_counter()
    streams = [
        StreamResult(f.stats.prompt_tokens, f.stats.completion_tokens, f.stats.ttft_s, f.stats.decode_tps)
        for f in finishes
    ]
    t_first = t_start + max(s.ttft_s or 0.0 for s in streams)
    return RunResult(streams, t_start, t_first, t_end)


def run_levels(
    engine: Engine,
    levels: list[int],
    max_tokens: int,
    repeats: int = 2,
    progress: Callable[[str], None] = lambda _: None,
    workload: str = "chat",
) -> list[LevelResult]:
    """For each concurrency, alternate engine and raw runs; keep the best decode rate of each.

    The raw loop runs on the engine's own context and thread, between engine runs.
    """
    raw = lambda ps_, n: engine.run_exclusive(lambda ctx: run_raw(ctx, ps_, n))  # noqa: E731
    warm = chat_prompts(engine, 1)
    run_engine(engine, warm, 8)
    raw(warm, 8)
    out = []
    for c in levels:
        ps = prompts(engine, workload, c)
        best_e: RunResult | None = None
        best_r: RunResult | None = None
        for i in range(repeats):
            progress(f"concurrency {c}: engine run {i + 1}/{repeats}")
            e = run_engine(engine, ps, max_tokens)
            progress(f"concurrency {c}: raw loop run {i + 1}/{repeats}")
            r = raw(ps, max_tokens)
            best_e, best_r = best(best_e, e), best(best_r, r)
        assert best_e is not None and best_r is not None
        out.append(LevelResult(c, best_e, best_r))
    return out


@dataclass(slots=True)
class SocketLevel:
    """In-process engine and a server over its socket at one concurrency, best of the repeats."""

    concurrency: int
    engine: RunResult
    socket: RunResult

    def as_dict(self) -> dict[str, object]:
        ratio = round(self.socket.total_tps / self.engine.total_tps, 3) if self.engine.total_tps else None
        return {
            "concurrency": self.concurrency,
            "engine": self.engine.figures(),
            "socket": self.socket.figures(),
            "socket_over_engine": ratio,
        }


def run_socket_levels(
    engine: Engine,
    socket_path: Path,
    levels: list[int],
    max_tokens: int,
    repeats: int = 2,
    api_key: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
    workload: str = "chat",
) -> list[SocketLevel]:
    """For each concurrency, alternate a run over the socket and one in-process.

    Each run's prompts carry a fresh tag, so neither side reuses an earlier run's KV
    beyond the shared template prefix, which both keep alike.
    """
    from edgeinfer.bench.remote import run_socket

    run_socket(socket_path, messages(workload, 1, "warm-up. "), 8, api_key)
    run_engine(engine, prompts(engine, workload, 1, "warm-up. "), 8, reset=False)
    out = []
    for c in levels:
        best_e: RunResult | None = None
        best_s: RunResult | None = None
        for i in range(repeats):
            progress(f"concurrency {c}: socket run {i + 1}/{repeats}")
            s = run_socket(socket_path, messages(workload, c, f"Run s{c}.{i}. "), max_tokens, api_key)
            progress(f"concurrency {c}: in-process run {i + 1}/{repeats}")
            e = run_engine(engine, prompts(engine, workload, c, f"Run e{c}.{i}. "), max_tokens, reset=False)
            best_e, best_s = best(best_e, e, "total_tps"), best(best_s, s, "total_tps")
        assert best_e is not None and best_s is not None
        out.append(SocketLevel(c, best_e, best_s))
    return out


@dataclass(slots=True)
class SpecLevel:
    """One engine with speculation on and off at one concurrency, best of the repeats."""

    concurrency: int
    on: RunResult
    off: RunResult
    acceptance: float | None

    def as_dict(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "spec_on": self.on.figures(),
            "spec_off": self.off.figures(),
            "on_over_off": round(self.on.decode_tps / self.off.decode_tps, 3) if self.off.decode_tps else None,
            "acceptance": None if self.acceptance is None else round(self.acceptance, 3),
        }


def run_spec_levels(
    engine: Engine,
    workload: str,
    levels: list[int],
    max_tokens: int,
    repeats: int = 2,
    progress: Callable[[str], None] = lambda _: None,
) -> list[SpecLevel]:
    """For each concurrency, alternate runs with speculation on and off on the same engine."""
    assert engine.spec is not None
    run_engine(engine, prompts(engine, workload, 1), 8)
    out = []
    for c in levels:
        ps = prompts(engine, workload, c)
        best_on: RunResult | None = None
        best_off: RunResult | None = None
        before = engine.spec.counters.drafted, engine.spec.counters.accepted
        for i in range(repeats):
            engine.set_speculation(True)
            progress(f"concurrency {c}: speculation on, run {i + 1}/{repeats}")
            on = run_engine(engine, ps, max_tokens)
            engine.set_speculation(False)
            progress(f"concurrency {c}: speculation off, run {i + 1}/{repeats}")
            off = run_engine(engine, ps, max_tokens)
            best_on, best_off = best(best_on, on), best(best_off, off)
        engine.set_speculation(True)
        drafted = engine.spec.counters.drafted - before[0]
        accepted = engine.spec.counters.accepted - before[1]
        assert best_on is not None and best_off is not None
        out.append(SpecLevel(c, best_on, best_off, accepted / drafted if drafted else None))
    return out


def run_url_levels(
    url: str,
    model: str | None,
    workload: str,
    levels: list[int],
    max_tokens: int,
    repeats: int = 2,
    api_key: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[tuple[int, RunResult]]:
    """Any OpenAI-compatible endpoint: the same workload, best aggregate tok/s of the repeats per level."""
    from edgeinfer.bench.remote import remote_model, run_url

    model = model or remote_model(url, api_key)
    run_url(url, model, messages(workload, 1, "warm-up. "), 8, api_key)
    out = []
    for c in levels:
        top: RunResult | None = None
        for i in range(repeats):
            progress(f"concurrency {c}: run {i + 1}/{repeats} against {url}")
            top = best(
                top, run_url(url, model, messages(workload, c, f"Run u{c}.{i}. "), max_tokens, api_key), "total_tps"
            )
        assert top is not None
        out.append((c, top))
    return out
