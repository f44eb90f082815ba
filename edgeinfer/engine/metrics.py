"""Rolling engine figures for the stats API, /metrics and the dashboard."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None if there are no values."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# Histogram bucket bounds in seconds, for Prometheus.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.bounds)

    def observe(self, x: float) -> None:
        self.n += 1
        self.total += x
        for i, b in enumerate(self.bounds):
            if x <= b:
                self.counts[i] += 1


@dataclass(slots=True)
class Metrics:
    """Counters since start plus rolling windows (timestamps from time.monotonic())."""

    window_s: float = 60.0
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0
    constrained_tokens: int = 0  # tokens of streams with a grammar
    forced_tokens: int = 0  # of those, appended because the grammar allowed nothing else
    decode_seconds: float = 0.0
    decoding_since: float | None = None  # time.perf_counter() when the llama_decode in progress began
    finished: dict[str, int] = field(default_factory=dict)
    ttft_hist: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl_hist: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    # (time, generated tokens in the step, batch tokens, decode seconds)
    steps_log: deque[tuple[float, int, int, float]] = field(default_factory=lambda: deque(maxlen=20000))
    ttfts: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=1000))
    itls: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=5000))

    def step(self, generated: int, batch_tokens: int, seconds: float) -> None:
        self.steps += 1
        self.decode_seconds += seconds
        self.generated_tokens += generated
        self.steps_log.append((time.monotonic(), generated, batch_tokens, seconds))

    def ttft(self, seconds: float) -> None:
        self.ttft_hist.observe(seconds)
        self.ttfts.append((time.monotonic(), seconds))

    def itl(self, seconds: float) -> None:
        self.itl_hist.observe(seconds)
        self.itls.append((time.monotonic(), seconds))

    def finish(self, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def generated_tps(self, over_s: float) -> float:
        """Generated tokens per second over the last `over_s` seconds."""
        since = time.monotonic() - over_s
        return sum(g for t, g, _, _ in self.steps_log if t >= since) / over_s

    def rolling(self) -> dict[str, float | None]:
        since = time.monotonic() - self.window_s
        ttft = [x for t, x in self.ttfts if t >= since]
        itl = [x for t, x in self.itls if t >= since]
        return {
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p95_s": percentile(ttft, 95),
            "itl_p50_s": percentile(itl, 50),
            "itl_p95_s": percentile(itl, 95),
        }
