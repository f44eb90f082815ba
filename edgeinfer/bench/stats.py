"""Benchmark figures: percentiles and per-run aggregates."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinfer.metrics import percentile


@dataclass(slots=True)
class StreamResult:
    """One stream's figures in a run."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None
    decode_tps: float | None


@dataclass(slots=True)
class RunResult:
    """All streams of one run at one concurrency."""

    streams: list[StreamResult]
    t_start: float
    t_all_first: float  # when the last stream got its first token: pure decode from here on
    t_end: float

    @property
    def decode_tps(self) -> float:
        """Aggregate decode tokens/s: tokens after each stream's first, over the all-decoding window."""
        tokens = sum(max(0, s.completion_tokens - 1) for s in self.streams)
        span = self.t_end - self.t_all_first
        return tokens / span if span > 0 else 0.0

    @property
    def total_tps(self) -> float:
        """Generated tokens over the whole run, prefill included."""
        span = self.t_end - self.t_start
        return sum(s.completion_tokens for s in self.streams) / span if span > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        span = self.t_all_first - self.t_start
        return sum(s.prompt_tokens for s in self.streams) / span if span > 0 else 0.0

    @property
    def per_stream_tps(self) -> float:
        xs = [s.decode_tps for s in self.streams if s.decode_tps]
        return sum(xs) / len(xs) if xs else 0.0

    def ttft(self, q: float) -> float | None:
        return percentile([s.ttft_s for s in self.streams if s.ttft_s is not None], q)

    def figures(self) -> dict[str, float | None]:
        """The run's figures for the JSON report."""
        return {
            "decode_tps": round(self.decode_tps, 2),
            "total_tps": round(self.total_tps, 2),
            "per_stream_tps": round(self.per_stream_tps, 2),
            "prefill_tps": round(self.prefill_tps, 2),
            "ttft_p50_s": _round(self.ttft(50)),
            "ttft_p95_s": _round(self.ttft(95)),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def best(current: RunResult | None, new: RunResult, key: str = "decode_tps") -> RunResult:
    """The better of two runs by a figure (best of the repeats)."""
    return new if current is None or getattr(new, key) > getattr(current, key) else current
