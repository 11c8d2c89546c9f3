"""Seeded arrival schedules: Poisson's mean and dispersion, constant exact, gamma with a
burstiness below 1 more dispersed than Poisson, and the same seed the same schedule."""

from __future__ import annotations

import math
import statistics

import pytest

from bench.arrivals import ArrivalPattern, gaps, schedule_count, schedule_duration
from engine.errors import BadOption

N = 20_000


def cv(values: list[float]) -> float:
    return statistics.pstdev(values) / statistics.fmean(values)


def test_poisson_gaps_have_the_rate_s_mean_and_a_dispersion_of_one() -> None:
    g = gaps(ArrivalPattern(4.0, "poisson", seed=3), N)
    # The mean of N exponential gaps is within 4 standard errors of 1/rate.
    assert statistics.fmean(g) == pytest.approx(0.25, abs=4 * 0.25 / math.sqrt(N))
    assert cv(g) == pytest.approx(1.0, abs=0.05)


def test_constant_gaps_are_exact() -> None:
    times = schedule_count(ArrivalPattern(5.0, "constant"), 10)
    assert times == pytest.approx([0.2 * (i + 1) for i in range(10)], abs=1e-12)


def test_burstiness_below_one_is_more_dispersed_than_one() -> None:
    bursty = gaps(ArrivalPattern(2.0, "gamma", burstiness=0.5, seed=1), N)
    poisson = gaps(ArrivalPattern(2.0, "gamma", burstiness=1.0, seed=1), N)
    regular = gaps(ArrivalPattern(2.0, "gamma", burstiness=4.0, seed=1), N)
    assert statistics.fmean(bursty) == pytest.approx(0.5, rel=0.05)  # the same rate
    # A gamma's coefficient of variation is 1/sqrt(shape): 1.41, 1, 0.5.
    assert cv(bursty) == pytest.approx(math.sqrt(2), rel=0.06)
    assert cv(bursty) > cv(poisson) > cv(regular)


def test_the_same_seed_repeats_the_schedule_and_another_does_not() -> None:
    a = schedule_count(ArrivalPattern(3.0, seed=7), 50)
    assert a == schedule_count(ArrivalPattern(3.0, seed=7), 50)
    assert a != schedule_count(ArrivalPattern(3.0, seed=8), 50)
    # As vLLM does for a count of prompts: the last send falls at count / rate.
    assert a[-1] == pytest.approx(50 / 3.0)


def test_inf_sends_all_at_once_and_a_duration_cuts_the_schedule() -> None:
    assert schedule_count(ArrivalPattern(math.inf), 8) == [0.0] * 8
    times = schedule_duration(ArrivalPattern(10.0, seed=2), 30.0)
    assert all(t <= 30.0 for t in times)
    assert len(times) == pytest.approx(300, abs=4 * math.sqrt(300))
    with pytest.raises(BadOption):
        schedule_duration(ArrivalPattern(math.inf), 5.0)
    with pytest.raises(BadOption) as info:
        schedule_duration(ArrivalPattern(10_000.0), 10**6)
    assert "at most 1,000,000" in info.value.plain()
