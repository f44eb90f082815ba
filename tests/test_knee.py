"""Knee detection on synthetic throughput curves, clean and noisy."""

import random

import pytest

from edgeinfer.bench.knee import find_knee, gain_per_doubling

pytestmark = pytest.mark.pure


def test_gain_per_doubling():
    assert gain_per_doubling(1, 100, 2, 150) == pytest.approx(0.5)
    assert gain_per_doubling(1, 100, 4, 225) == pytest.approx(0.5)  # 1.5 x 1.5 over two doublings


def test_knee_where_throughput_flattens_and_latency_rises():
    levels = [1, 2, 4, 8, 16, 32]
    tps = [90, 160, 260, 300, 310, 312]  # saturates after 8
    p95 = [0.1, 0.12, 0.15, 0.25, 0.5, 1.0]
    knee = find_knee(levels, tps, p95)
    assert knee.found and knee.parallel == 8
    assert knee.gain_after == pytest.approx(310 / 300 - 1)


def test_no_knee_while_throughput_still_grows():
    knee = find_knee([1, 2, 4], [90, 170, 320], [0.1, 0.1, 0.2])
    assert not knee.found and knee.parallel == 4


def test_flat_throughput_with_flat_latency_is_not_a_knee():
    # Gains stop, but latency does not rise: no reason yet to stop adding streams.
    knee = find_knee([1, 2, 4], [100, 102, 104], [0.2, 0.2, 0.2])
    assert not knee.found


def test_a_tolerance_sets_how_close_to_the_best_is_close_enough():
    levels, tps, p95 = [1, 2, 4], [100, 115, 125], [0.1, 0.2, 0.4]
    assert find_knee(levels, tps, p95, tolerance=0.10).parallel == 2  # 115 is 92% of 125
    assert find_knee(levels, tps, p95, tolerance=0.25).parallel == 1  # 100 is 80% of 125


def test_a_slow_start_does_not_hide_a_later_rise():
    # Measured side by side: the per-doubling gain from 1 to 4 (8%) is small, the one from
    # 4 to 16 (15%) is not; 1 stream gives 65% of the best throughput, so 1 is not the answer.
    knee = find_knee([1, 4, 16], [73.6, 85.8, 112.7], [0.05, 0.08, 0.2])
    assert knee.parallel == 16


@pytest.mark.parametrize("seed", range(40))
def test_noisy_curves(seed):
    rng = random.Random(seed)
    noisy = lambda xs, pct: [x * (1 + rng.uniform(-pct, pct)) for x in xs]  # noqa: E731
    # The shape, each point off by up to 5%: 16 streams, never 1 or 4.
    knee = find_knee([1, 4, 16], noisy([73.6, 85.8, 112.7], 0.05), noisy([0.05, 0.08, 0.2], 0.05))
    assert knee.parallel == 16, knee
    # A plateau from 8 streams on, each point off by up to 2%: the plateau's first level, not a
    # noise bump further along it, and not the last level before the plateau.
    levels = [1, 2, 4, 8, 16, 32]
    tps = noisy([90, 160, 260, 300, 300, 300], 0.02)
    p95 = [0.1, 0.12, 0.15, 0.25, 0.5, 1.0]
    knee = find_knee(levels, tps, p95)
    assert knee.found and knee.parallel == 8, (tps, knee)
    # A dip in the middle of a still-rising curve is no knee either.
    knee = find_knee(levels, noisy([90, 170, 160, 320, 600, 1100], 0.02), p95)
    assert not knee.found and knee.parallel == 32
