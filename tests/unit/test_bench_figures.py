"""The benchmark's own arithmetic: the summary of several rounds (bench/delivery.py) and the
lag trend that says whether the engine kept up with an offered rate (bench/engine.py)."""

from __future__ import annotations

import pytest

from bench.delivery import summarize_rounds
from bench.engine import lag_trend


def test_one_round_is_reported_as_it_is() -> None:
    one = {"agent_per_s": 4_000.0, "agent_cpu_us_per_delivery": 200.0}
    assert summarize_rounds([one]) == one


def test_several_rounds_give_the_median_lowest_and_highest() -> None:
    got = summarize_rounds([{"agent_per_s": v} for v in (4_100.0, 3_000.0, 5_000.0)])
    assert got == {"agent_per_s": 4_100.0, "agent_per_s_min": 3_000.0,
                   "agent_per_s_max": 5_000.0, "agent_per_s_rounds": 3.0}


def test_the_lag_trend_is_level_when_the_engine_keeps_up() -> None:
    # rows on record trail by ~0.5 s of traffic at 4,000/s, with the sink's bursts
    lags = [(t / 4, 2_000 + (300 if t % 2 else -300)) for t in range(1, 41)]
    assert abs(lag_trend(lags)) < 0.02 * 4_000


def test_the_lag_trend_is_the_shortfall_when_the_engine_falls_behind() -> None:
    # offered 4,500/s, on record 4,200/s: 300 more behind every second
    lags = [(t / 4, 1_000 + 300 * t / 4) for t in range(1, 41)]
    assert lag_trend(lags) == pytest.approx(300)


def test_the_lag_trend_needs_samples() -> None:
    with pytest.raises(ValueError, match="too few"):
        lag_trend([(t / 4, 10.0 * t) for t in range(1, 12)])  # 3 s: 4 samples past 2 s
