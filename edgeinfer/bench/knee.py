"""The concurrency knee: where adding streams stops adding throughput but still adds latency."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Knee:
    """The recommendation drawn from a concurrency sweep."""

    parallel: int  # the --parallel to use
    found: bool  # False: throughput was still rising at the largest level tried
    gain_after: float | None  # throughput gain per doubling of streams past the knee
    reason: str


def gain_per_doubling(c0: int, t0: float, c1: int, t1: float) -> float:
    """Relative throughput gain per doubling of concurrency between two levels."""
    doublings = math.log2(c1 / c0)
    return (t1 / t0) ** (1.0 / doublings) - 1.0 if t0 > 0 and doublings > 0 else 0.0


def find_knee(levels: list[int], throughput: list[float], p95: list[float | None], threshold: float = 0.10) -> Knee:
    """The first level after which a doubling adds less than `threshold` throughput while p95 latency rises.

    levels must be increasing; throughput in tokens/s; p95 in seconds (None: unknown, counted as rising).
    """
    if len(levels) != len(throughput) or len(levels) != len(p95) or not levels:
        raise ValueError("levels, throughput and p95 must be non-empty and of one length")
    for i in range(len(levels) - 1):
        g = gain_per_doubling(levels[i], throughput[i], levels[i + 1], throughput[i + 1])
        a, b = p95[i], p95[i + 1]
        rising = a is None or b is None or b > a
        if g < threshold and rising:
            return Knee(
                levels[i],
                True,
                g,
                f"beyond {levels[i]} streams a doubling adds {g:+.0%} throughput while p95 latency keeps rising",
            )
    return Knee(
        levels[-1], False, None, f"throughput still rises at {levels[-1]} streams: try higher --concurrency levels"
    )
