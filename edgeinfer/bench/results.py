"""Benchmark figures: one stream's timeline, and a run's percentiles and rates."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from edgeinfer.engine.metrics import percentile


@dataclass(slots=True)
class StreamResult:
    """One stream of a run, as its client saw it."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None  # request sent to first token received
    arrivals: list[float] = field(default_factory=list)  # seconds since sent, of each chunk that carried tokens
    drafted: int = 0  # draft tokens proposed for this stream, where the target reports it
    accepted: int = 0

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time from the first token to the last."""
        span = self.arrivals[-1] - self.arrivals[0] if len(self.arrivals) > 1 else 0.0
        return (self.completion_tokens - 1) / span if self.completion_tokens > 1 and span > 0 else None

    def gaps(self) -> list[float]:
        """Inter-token latencies: the gaps between successive arrivals."""
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


@dataclass(slots=True)
class RunResult:
    """All streams of one run at one concurrency, sent together."""

    streams: list[StreamResult]
    t_start: float  # when the requests were sent
    t_end: float
    # The streams of the other repeats this run was kept over (`best`): their gaps join the inter-token latency's
    # percentiles. One 128-token answer has 127 gaps, so its p99 is its second-longest gap, one noisy moment.
    repeats: list[StreamResult] = field(default_factory=list)
    # Aggregate tok/s of every repeat `best` weighed, in the order they ran (empty: this run alone): on a shared
    # machine whose speed drifts, each repeat against another target's run beside it (`paired`) ranks two
    # targets where their bests, taken minutes apart, do not.
    each_tps: list[float] = field(default_factory=list)

    @property
    def repeat_tps(self) -> list[float]:
        """Aggregate tok/s of each repeat, in the order they ran."""
        return self.each_tps or [self.total_tps]

    @property
    def t_all_first(self) -> float:
        """When the last stream got its first token: pure decode from here on."""
        return self.t_start + max((s.ttft_s or 0.0 for s in self.streams), default=0.0)

    @property
    def total_tps(self) -> float:
        """Aggregate tok/s: generated tokens over the whole run, prefill included."""
        span = self.t_end - self.t_start
        return sum(s.completion_tokens for s in self.streams) / span if span > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        """Aggregate decode tok/s: tokens after each stream's first, over the all-decoding window."""
        tokens = sum(max(0, s.completion_tokens - 1) for s in self.streams)
        span = self.t_end - self.t_all_first
        return tokens / span if span > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        """Prompt tokens (reused ones included) over the time until every stream had its first token."""
        span = self.t_all_first - self.t_start
        return sum(s.prompt_tokens for s in self.streams) / span if span > 0 else 0.0

    @property
    def per_stream_tps(self) -> float:
        """The mean of each stream's own decode rate: the speed one user sees."""
        xs = [x for s in self.streams if (x := s.decode_tps)]
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def requests_per_s(self) -> float:
        span = self.t_end - self.t_start
        return len(self.streams) / span if span > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted tokens; None when the target drafted nothing or does not say."""
        drafted = sum(s.drafted for s in self.streams)
        return sum(s.accepted for s in self.streams) / drafted if drafted else None

    def ttft(self, q: float) -> float | None:
        return percentile([s.ttft_s for s in self.streams if s.ttft_s is not None], q)

    def itl(self, q: float) -> float | None:
        """Over the gaps of this run and of the repeats it was kept over."""
        return percentile([g for s in (*self.streams, *self.repeats) for g in s.gaps()], q)

    def figures(self) -> dict[str, float | int | list[float] | None]:
        """The run's figures for the JSON report (seconds and tokens/s)."""
        return {
            "streams": len(self.streams),
            "completion_tokens": sum(s.completion_tokens for s in self.streams),
            "aggregate_tps": round(self.total_tps, 2),
            "aggregate_tps_each": [round(x, 2) for x in self.repeat_tps],
            "decode_tps": round(self.decode_tps, 2),
            "per_stream_tps": round(self.per_stream_tps, 2),
            "prefill_tps": round(self.prefill_tps, 2),
            "requests_per_s": round(self.requests_per_s, 3),
            "ttft_p50_s": _round(self.ttft(50)),
            "ttft_p95_s": _round(self.ttft(95)),
            "ttft_p99_s": _round(self.ttft(99)),
            "itl_p50_s": _round(self.itl(50)),
            "itl_p99_s": _round(self.itl(99)),
            "acceptance": _round(self.acceptance),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def best(current: RunResult | None, new: RunResult, key: str = "total_tps") -> RunResult:
    """The better of two runs by a figure (best of the repeats); it keeps the other's streams for the
    inter-token latency, which is taken over every repeat."""
    if current is None:
        return new
    kept, other = (new, current) if getattr(new, key) > getattr(current, key) else (current, new)
    kept.each_tps = [*current.repeat_tps, *new.repeat_tps]
    kept.repeats += [*other.streams, *other.repeats]
    return kept


def paired(run: RunResult, against: RunResult) -> float | None:
    """The median over the repeats of one run's aggregate tok/s over the other's in the same repeat (None
    unless both have the same repeats, two or more)."""
    mine, theirs = run.repeat_tps, against.repeat_tps
    if len(mine) != len(theirs) or len(mine) < 2 or not all(theirs):
        return None
    return statistics.median(a / b for a, b in zip(mine, theirs, strict=True))


def warm_figure(report: dict[str, Any], target: str, key: str = "decode_tps") -> dict[int, float]:
    """From a `bench --json` report: one warm-run figure of one target, by concurrency (scripts compare these)."""
    return {row["concurrency"]: row["targets"][target]["warm"][key] for row in report["levels"]}
