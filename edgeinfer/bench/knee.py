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


def find_knee(levels: list[int], throughput: list[float], p95: list[float | None], tolerance: float = 0.05) -> Knee:
    """The smallest level within `tolerance` of the best throughput beyond which p95 latency rises.

    The whole curve is judged, not neighbouring pairs: a slow start (a small gain from 1 to 4
    streams) followed by a large rise must not stop the search early, and noise of a few percent
    on a plateau must not move the answer to a later point of it. A level whose latency does
    not rise beyond it costs nothing to leave behind, so the search moves on past it.

    levels must be increasing; throughput in tokens/s; p95 in seconds (None: unknown, counted as rising).
    """
    if len(levels) != len(throughput) or len(levels) != len(p95) or not levels:
        raise ValueError("levels, throughput and p95 must be non-empty and of one length")
    best = max(range(len(levels)), key=lambda i: throughput[i])
    close_enough = (1.0 - tolerance) * throughput[best]
    for i in range(len(levels) - 1):
        if throughput[i] < close_enough:
            continue
        here = p95[i]
        rising = any(later is None or here is None or later > here for later in p95[i + 1 :])
        if not rising:
            continue
        g = gain_per_doubling(levels[i], throughput[i], levels[i + 1], throughput[i + 1])
        share = throughput[i] / throughput[best] if throughput[best] > 0 else 1.0
        return Knee(
            levels[i],
            True,
            g,
            f"{levels[i]} streams give {share:.0%} of the best throughput ({throughput[best]:.1f} tok/s at "
            f"{levels[best]}); more streams add p95 latency",
        )
    return Knee(
        levels[-1], False, None, f"throughput still rises at {levels[-1]} streams: try higher --concurrency levels"
    )
