"""Knee detection on synthetic throughput curves."""

import pytest

from edgeinfer.bench.knee import find_knee, gain_per_doubling


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


def test_a_threshold_sets_how_flat_is_flat():
    levels, tps, p95 = [1, 2, 4], [100, 115, 125], [0.1, 0.2, 0.4]
    assert find_knee(levels, tps, p95, threshold=0.10).parallel == 2
    assert find_knee(levels, tps, p95, threshold=0.20).parallel == 1
