"""Adaptive speculation: measured costs and acceptance set each stream's draft length every step.

The rule is marginal. Without speculation a step decodes `base` tokens in T(base)
seconds and yields R0 = streams / T(base) tokens per second. One more token in the
batch costs `slope` seconds, worth slope * R0 tokens at that rate; the k-th draft token
of a stream yields alpha^k expected tokens (alpha: the stream's per-token acceptance).
So a stream drafts its k-th token only while alpha^k > slope * R0. A draft model adds
one draft step per depth d, worth T_draft * R0 tokens, shared by the streams drafting
that deep: depth d is used only while the sum of alpha_s^d pays for it. As load rises,
the batch turns compute-bound, slope * R0 approaches 1, and speculation steps back.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Batch sizes at which step times are tracked; others are interpolated.
_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048)


def _ema(table: dict[int, float], key: int, x: float, weight: float) -> None:
    """Move table[key] towards x by weight (the first observation is taken as is)."""
    old = table.get(key)
    table[key] = x if old is None else old + weight * (x - old)


def _bucket(n: int) -> int:
    i = bisect.bisect_left(_BUCKETS, n)
    return _BUCKETS[min(i, len(_BUCKETS) - 1)]


@dataclass(slots=True)
class StepCosts:
    """Exponential moving averages of step seconds by batch size (tokens, or streams for drafts)."""

    weight: float = 0.2
    table: dict[int, float] = field(default_factory=dict)

    def observe(self, n: int, seconds: float) -> None:
        _ema(self.table, _bucket(n), seconds, self.weight)

    def estimate(self, n: int) -> float | None:
        """Seconds for a batch of n: linear between the nearest measured buckets; None if none."""
        if not self.table:
            return None
        xs = sorted(self.table)
        b = _bucket(n)
        if b in self.table:
            return self.table[b]
        lo = [x for x in xs if x < b]
        hi = [x for x in xs if x > b]
        if lo and hi:
            x0, x1 = lo[-1], hi[0]
            y0, y1 = self.table[x0], self.table[x1]
            return y0 + (y1 - y0) * (b - x0) / (x1 - x0)
        if len(xs) >= 2:  # extrapolate from the two nearest
            x0, x1 = (xs[-2], xs[-1]) if hi == [] else (xs[0], xs[1])
            y0, y1 = self.table[x0], self.table[x1]
            slope = max((y1 - y0) / (x1 - x0), 0.0)
            return max(y0 + slope * (b - x0), 0.0)
        return self.table[xs[0]]


@dataclass(slots=True)
class Acceptance:
    """Per-token acceptance probability, as an exponential moving average of observed drafts."""

    alpha: float
    weight: float = 0.15

    def update(self, drafted: int, accepted: int) -> None:
        # Each accepted token is a success; the first rejected one (if any) a failure.
        for _ in range(accepted):
            self.alpha += self.weight * (1.0 - self.alpha)
        if accepted < drafted:
            self.alpha += self.weight * (0.0 - self.alpha)


@dataclass(slots=True)
class Candidate:
    """A stream that could speculate this step."""

    key: int
    alpha: float
    available: int  # drafts it could have (n-gram: what the lookup found; model: the cap)


class Controller:
    """Chooses per-stream draft lengths from measured costs; 0 means no speculation."""

    def __init__(self, max_draft: int, explore_every: int = 32, margin: float = 1.25) -> None:
        self.max_draft = max_draft
        self.margin = margin
        self.target = StepCosts()
        self.draft = StepCosts()
        self.explore_every = explore_every
        self._steps = 0

    def plan(
        self, candidates: list[Candidate], base_tokens: int, n_decoding: int, uses_draft_model: bool
    ) -> dict[int, int]:
        self._steps += 1
        if not candidates or self.max_draft == 0:
            return {}
        t_base = self.target.estimate(base_tokens)
        t_more = self.target.estimate(base_tokens + max(4, len(candidates)))
        if t_base is None or t_more is None:
            return self._explore(candidates)
        slope = max((t_more - t_base) / max(4, len(candidates)), 0.0)
        rate = max(n_decoding, 1) / t_base  # tokens/s without speculation
        # What one extra batch token costs, in tokens; the margin covers verification work
        # outside llama_decode (logits rows, sampling) and noise in the estimates.
        per_token = slope * rate * self.margin
        plan = {}
        for c in candidates:
            k = 0
            while k < min(c.available, self.max_draft) and c.alpha ** (k + 1) > per_token:
                k += 1
            plan[c.key] = k
        if uses_draft_model:
            plan = self._cut_depths(plan, candidates, rate)
        if not any(plan.values()) and self._steps % self.explore_every == 0:
            return self._explore(candidates)
        return plan

    def _cut_depths(self, plan: dict[int, int], candidates: list[Candidate], rate: float) -> dict[int, int]:
        """Keep draft depth d only while the streams drafting that deep pay for its draft step."""
        alpha = {c.key: c.alpha for c in candidates}
        depth = 0
        for d in range(1, max(plan.values(), default=0) + 1):
            deep = [key for key, k in plan.items() if k >= d]
            t_step = self.draft.estimate(len(deep))
            if t_step is None:
                break  # unmeasured: take one depth, measure it, decide next time
            if sum(alpha[key] ** d for key in deep) <= t_step * rate:
                break
            depth = d
        if depth == 0 and not self.draft.table:
            depth = 1
        return {key: min(k, depth) for key, k in plan.items()}

    def _explore(self, candidates: list[Candidate]) -> dict[int, int]:
        """Too little measured yet: a short draft on one stream, to learn its cost and acceptance."""
        best = max(candidates, key=lambda c: c.alpha)
        return {best.key: min(2, best.available, self.max_draft)}


@dataclass(slots=True)
class Gate:
    """Checks the cost model against what speculation actually delivers.

    For each batch size it keeps the realised tokens per second of decode-only steps
    with drafts and without, drafting time included (a draft model's catch-up on a new
    prompt too). Where drafting delivers less it is switched off for that batch size and
    re-tried after a pause that doubles with every failed re-try. One step in
    `probe_every` runs without drafts, so the baseline is always measured.
    """

    weight: float = 0.2
    probe_every: int = 16
    retry_every: int = 64
    max_retry: int = 4096
    min_samples: int = 2
    on: dict[int, float] = field(default_factory=dict)
    off: dict[int, float] = field(default_factory=dict)
    n_on: dict[int, int] = field(default_factory=dict)
    n_off: dict[int, int] = field(default_factory=dict)
    next_retry: dict[int, int] = field(default_factory=dict)
    pause: dict[int, int] = field(default_factory=dict)
    steps: int = 0

    def allows(self, n_decoding: int) -> bool:
        self.steps += 1
        if self.steps % self.probe_every == 0:
            return False
        b = _bucket(n_decoding)
        if self.n_on.get(b, 0) < self.min_samples or self.n_off.get(b, 0) < self.min_samples:
            return True
        if self.on[b] >= self.off[b]:
            self.pause[b] = self.retry_every
            return True
        if b not in self.next_retry:
            self.next_retry[b] = self.steps + self.pause.setdefault(b, self.retry_every)
        if self.steps >= self.next_retry[b]:
            self.pause[b] = min(2 * self.pause.get(b, self.retry_every), self.max_retry)
            self.next_retry[b] = self.steps + self.pause[b]
            return True
        return False

    def observe(self, n_decoding: int, drafted: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0 or n_decoding == 0:
            return
        b = _bucket(n_decoding)
        rates, counts = (self.on, self.n_on) if drafted else (self.off, self.n_off)
        _ema(rates, b, tokens / seconds, self.weight)
        counts[b] = counts.get(b, 0) + 1
