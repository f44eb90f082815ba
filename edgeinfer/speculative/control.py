"""Adaptive speculation: measured costs and acceptance set each stream's draft length every step.

The rule is marginal. Without speculation a step decodes `base` tokens in T(base)
seconds and yields R0 = streams / T(base) tokens per second. The batch's j-th extra token
costs T(base + j) - T(base + j - 1) seconds, worth that times R0 tokens at that rate; a
stream's k-th draft token yields alpha^k expected tokens (alpha: the per-token acceptance of
its draft, by what backs it, speculator.py). Extra tokens go to the likeliest first while
each pays for its own cost: on a CPU the first costs the most (one stream: about half a
step), on a GPU almost nothing. A draft model adds one draft step per depth d, worth
T_draft * R0 tokens, shared by the streams drafting that deep: depth d is used only while
the sum of alpha_s^d pays for it. As load rises, the batch turns compute-bound, each
token's cost * R0 approaches 1, and speculation steps back.

A step with drafts also keeps every token waiting until it ends: a one-stream step of nine tokens
costs about four plain steps on a CPU, so the tokens it brings arrive after a gap four times the
usual (a chat's stutter, and the inter-token latency's p99). So a step's drafts are also capped
where its estimated time, drafting included, would pass LATENCY_CAP plain steps: alone on a CPU
that holds a stream to a draft token or two, where at 16 streams an extra token costs little of a step.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

# A step with drafts takes at most this many plain steps' time. Inter-token latency's p99 is held to twice its
# p50; the estimate errs and the machine is noisy, so the cap stands below 2 (at 2.0 one stream's p99 measured
# 1.5-2.1x its p50, scripts/one_stream.py, docs/benchmarks.md).
LATENCY_CAP = 1.75
K = TypeVar("K")
# Batch sizes at which step times are tracked; others are interpolated.
_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048)


def _ema(table: dict[K, float], key: K, x: float, weight: float) -> None:
    """Move table[key] towards x by weight (the first observation is taken as is)."""
    old = table.get(key)
    table[key] = x if old is None else old + weight * (x - old)


def _bucket(n: int) -> int:
    i = bisect.bisect_left(_BUCKETS, n)
    return _BUCKETS[min(i, len(_BUCKETS) - 1)]


@dataclass(slots=True)
class StepCosts:
    """Exponential moving averages of step seconds by batch size (tokens, or streams for drafts).

    A step with drafts is also kept as a multiple of the plain step it grew from (`ratios`, by the
    buckets of the plain size and of the whole). A plain step is measured nearly every step and follows
    the context as it grows; a size seen only with drafts may last have been measured at another
    context: at one stream, seconds kept by size said 18 ms for two tokens where one took 22 ms, after
    the context grew from 1k to 4k tokens, and the step of five tokens they allowed took 55 ms. What a
    step with drafts will take is that multiple of the plain step's time now.
    """

    weight: float = 0.2
    table: dict[int, float] = field(default_factory=dict)
    ratios: dict[tuple[int, int], float] = field(default_factory=dict)

    def observe(self, n: int, seconds: float, drafts: int = 0) -> None:
        # A multiple is learned only against a plain step of the base's own size: one estimated from other sizes
        # (a fresh server's 512-token prompt chunks, 4.9 s at 7,680 tokens of context) gave a multiple of 0.03,
        # and the estimates it gave let through a run of nine-token steps of four plain steps each.
        t_base = self.estimate(n - drafts) if drafts > 0 and self.measured(n - drafts) else None
        if t_base:
            key, ratio = (_bucket(n - drafts), _bucket(n)), seconds / t_base
            # A busy machine only ever slows a step: a slower one than expected moves the multiple a quarter as
            # far as a faster one (two 30 ms steps among 19 ms ones put one stream's 2-token step over the cap).
            old = self.ratios.get(key)
            _ema(self.ratios, key, ratio, self.weight if old is None or ratio < old else self.weight / 4)
        _ema(self.table, _bucket(n), seconds, self.weight)

    def measured(self, n: int) -> bool:
        """Steps of n's bucket have been timed: an estimate of n is not drawn from other sizes alone."""
        return _bucket(n) in self.table

    def estimate(self, n: int, base: int | None = None) -> float | None:
        """Seconds for a batch of n; given `base`, for n grown by drafts from a plain batch of base tokens."""
        if base is None or n <= base:
            return self._by_size(n)
        return self.grown_from(base)(n)

    def grown_from(self, base: int) -> Callable[[int], float | None]:
        """estimate(n, base) for sizes n > base, the plain step and its multiples looked up once: a plan asks
        for every extra token's size in turn (128 at 16 streams of 8 drafts; 0.5 ms a step when each call
        looked them up again). A step with drafts is its measured multiple of the plain step of base's
        bucket, linear between the measured sizes (1.0 at the bucket itself) and extrapolated upwards from
        the last two; with no multiple measured from that bucket, the larger of its size's step and base's."""
        t_base = self._by_size(base)
        b0 = _bucket(base)
        points = {size: r for (b, size), r in self.ratios.items() if b == b0}
        if points:
            points.setdefault(b0, 1.0)

        def at(n: int) -> float | None:
            if t_base is None:
                return None
            if points:
                return t_base * _interpolate(points, n)
            t = self._by_size(n)
            return None if t is None else max(t, t_base)

        return at

    def _by_size(self, n: int) -> float | None:
        """Linear between the nearest measured sizes (kept by bucket); None if none."""
        if not self.table:
            return None
        return _interpolate(self.table, n)


def _interpolate(points: dict[int, float], b: int) -> float:
    """The value at b of the line through the nearest points either side; past either end, the line
    through the two nearest (never sloping down); a single point's value everywhere."""
    if b in points:
        return points[b]
    xs = sorted(points)
    lo = [x for x in xs if x < b]
    hi = [x for x in xs if x > b]
    if lo and hi:
        x0, x1 = lo[-1], hi[0]
        y0, y1 = points[x0], points[x1]
        return y0 + (y1 - y0) * (b - x0) / (x1 - x0)
    if len(xs) >= 2:  # extrapolate from the two nearest
        x0, x1 = (xs[-2], xs[-1]) if hi == [] else (xs[0], xs[1])
        y0, y1 = points[x0], points[x1]
        slope = max((y1 - y0) / (x1 - x0), 0.0)
        return max(y0 + slope * (b - x0), 0.0)
    return points[xs[0]]


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

    def __init__(self, max_draft: int, explore_every: int = 32, explore_max: int = 1024, margin: float = 1.25) -> None:
        self.max_draft = max_draft
        self.margin = margin
        self.target = StepCosts()
        self.draft = StepCosts()
        # Where the costs refuse drafts, an exploring draft measures them again: the first explore_every
        # steps after the costs last chose drafts, then at twice the previous gap, up to explore_max. An
        # exploring step is one the costs priced past the cap, so it is the longest gap between tokens: at
        # one stream on a 2-core CPU (a 2-token step 1.7-1.9 plain ones) one every 32 steps was 1.6% of a
        # chat's gaps, and set its inter-token latency's p99.
        self.explore_every = explore_every
        self.explore_max = explore_max
        self._explore_gap = explore_every
        self._next_explore = explore_every
        self._steps = 0
        self.explored = False  # the last plan was an exploring draft, not one the costs chose

    def plan(
        self, candidates: list[Candidate], base_tokens: int, n_decoding: int, uses_draft_model: bool
    ) -> dict[int, int]:
        self._steps += 1
        self.explored = False
        if not candidates or self.max_draft == 0:
            return {}
        t_base = self.target.estimate(base_tokens)
        if not self.target.measured(base_tokens) or not t_base:
            # A plain step first: it times the base size, and drafts are priced against it. Estimated from other
            # sizes only, a step of one token after a long prompt came out as the prompt's 512-token chunks (a
            # single size measured: its time everywhere) or as 0 s (two sizes, extrapolated down), and a plan priced
            # on that drafted eight tokens a step at four plain steps' time (one stream, 7,680 tokens of context).
            return {}
        grown = self.target.grown_from(base_tokens)
        rate = max(n_decoding, 1) / t_base  # tokens/s without speculation
        plan = dict.fromkeys((c.key for c in candidates), 0)
        # The batch's extra tokens, the likeliest to be accepted first (a stream's k-th draft token: alpha^k), each
        # while it is worth more than what it adds to the step, in tokens at that rate. The margin covers
        # verification work outside llama_decode (logits rows, sampling) and noise in the estimates. Extra
        # tokens cost most at the start on a CPU (one stream: the first 0.48 of a step, the next ones 0.3-0.4).
        heap = [(-c.alpha, i, c) for i, c in enumerate(candidates) if min(c.available, self.max_draft) > 0]
        heapq.heapify(heap)
        total, t_prev = 0, t_base
        while heap:
            gain, i, c = heapq.heappop(heap)
            t_next = grown(base_tokens + total + 1)
            assert t_next is not None  # the base is measured
            if -gain <= max(t_next - t_prev, 0.0) * rate * self.margin:
                break
            plan[c.key] += 1
            total, t_prev = total + 1, t_next
            if plan[c.key] < min(c.available, self.max_draft):
                heapq.heappush(heap, (-(c.alpha ** (plan[c.key] + 1)), i, c))
        if uses_draft_model:
            plan = self._cut_depths(plan, candidates, rate)
        plan = self._within_latency(plan, candidates, base_tokens, t_base, uses_draft_model)
        if any(plan.values()):
            self._explore_gap = self.explore_every
            self._next_explore = self._steps + self.explore_every
        elif self._steps >= self._next_explore:
            # Past the cap too: what a step with drafts costs is only measured by taking one. A few slow
            # steps on a busy machine can put a drafted step's estimate over the cap; without this it
            # would never be measured again, and the stream never draft again.
            self._explore_gap = min(2 * self._explore_gap, self.explore_max)
            self._next_explore = self._steps + self._explore_gap
            plan = self._explore(candidates)
        return plan

    def _within_latency(
        self, plan: dict[int, int], candidates: list[Candidate], base_tokens: int, t_base: float, drafts: bool
    ) -> dict[int, int]:
        """Drop draft tokens, the least likely to be accepted first, until the step's estimated time (a draft
        model's steps included) is at most LATENCY_CAP plain steps."""
        alpha = {c.key: c.alpha for c in candidates}
        plan = dict(plan)
        # Estimates are the same across a bucket, and a trim may drop a hundred tokens one by one: each
        # bucket is estimated once, and the next token to drop comes off a heap (ties: the plan's order).
        target: dict[int, float | None] = {}
        draft: dict[int, float] = {}
        heap = [(alpha[key] ** k, i, key) for i, (key, k) in enumerate(plan.items()) if k > 0]
        heapq.heapify(heap)
        total = sum(plan.values())
        while total > 0:
            n = base_tokens + total
            if (b := _bucket(n)) not in target:
                target[b] = self.target.estimate(n, base_tokens)
            if (t_step := target[b]) is None:
                break
            if drafts:
                for d in range(1, max(plan.values()) + 1):
                    streams = sum(1 for k in plan.values() if k >= d)
                    if (b := _bucket(streams)) not in draft:
                        draft[b] = self.draft.estimate(streams) or 0.0
                    t_step += draft[b]
            if t_step <= LATENCY_CAP * t_base:
                break
            _, i, last = heapq.heappop(heap)
            plan[last] -= 1
            total -= 1
            if plan[last] > 0:
                heapq.heappush(heap, (alpha[last] ** plan[last], i, last))
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
        """The costs chose no draft: one draft token on the likeliest stream, to measure its cost and acceptance."""
        self.explored = True
        best = max(candidates, key=lambda c: c.alpha)
        return {best.key: min(1, best.available, self.max_draft)}


@dataclass(slots=True)
class Gate:
    """Checks the cost model against what speculation actually delivers.

    For each batch size it keeps the realised tokens per second of decode-only steps
    with drafts and without, drafting time included (a draft model's catch-up on a new
    prompt too): their mean over the first samples, then a moving average. Where drafting
    delivers less it is switched off for that batch size and tried again, min_samples steps
    afresh, after a pause that doubles with every failed trial. One step in `probe_every`
    runs without drafts, so the baseline is always measured.
    """

    weight: float = 0.2
    probe_every: int = 16
    retry_every: int = 64
    max_retry: int = 4096
    min_samples: int = 4
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
            self.next_retry.pop(b, None)
            return True
        if b not in self.next_retry:
            self.next_retry[b] = self.steps + self.pause.setdefault(b, self.retry_every)
        if self.steps >= self.next_retry[b]:
            # A trial as at the start: its own min_samples steps (one would only nudge the average).
            self.pause[b] = min(2 * self.pause.get(b, self.retry_every), self.max_retry)
            del self.next_retry[b], self.on[b], self.n_on[b]
            return True
        return False

    def observe(self, n_decoding: int, drafted: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0 or n_decoding == 0:
            return
        b = _bucket(n_decoding)
        rates, counts = (self.on, self.n_on) if drafted else (self.off, self.n_off)
        counts[b] = counts.get(b, 0) + 1
        _ema(rates, b, tokens / seconds, max(self.weight, 1.0 / counts[b]))
