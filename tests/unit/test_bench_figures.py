"""The benchmark's own arithmetic: the summary of several rounds and the merge into the
results file (bench/figures.py), and the lag trend and verdict that say whether the
engine kept up with an offered rate (bench/engine.py)."""

from __future__ import annotations

import pytest

from bench.engine import FELL_BEHIND, KEPT_UP, lag_trend, verdict
from bench.figures import host_relative, merge_results, summarize_rounds


def test_one_round_is_reported_as_it_is() -> None:
    one = {"agent_per_s": 4_000.0, "agent_cpu_us_per_delivery": 200.0}
    assert summarize_rounds([one]) == one


def test_several_rounds_give_the_median_lowest_and_highest() -> None:
    got = summarize_rounds([{"agent_per_s": v} for v in (4_100.0, 3_000.0, 5_000.0)])
    assert got == {"agent_per_s": 4_100.0, "agent_per_s_min": 3_000.0,
                   "agent_per_s_max": 5_000.0, "agent_per_s_rounds": 3.0}


def test_rounds_count_their_verdicts_and_keep_a_figure_only_some_measured() -> None:
    got = summarize_rounds([{"x_kept_up": 1.0, "x_per_s": 10.0},
                            {"x_kept_up": 0.0, "x_per_s": 20.0, "y_per_s": 5.0},
                            {"x_kept_up": 1.0, "x_per_s": 30.0}])
    assert got["x_kept_up"] == 2.0 and got["x_kept_up_rounds"] == 3.0
    assert got["y_per_s"] == 5.0 and got["y_per_s_rounds"] == 1.0


def test_throughput_is_read_against_the_bare_client_of_the_same_round() -> None:
    got = host_relative({"bare_client_per_s": 4_000.0, "engine_end_to_end_per_s": 1_800.0,
                         "engine_offered_per_s": 2_000.0, "end_to_end_per_s": 1_000.0,
                         "agent_per_s": 2_400.0})
    assert got == pytest.approx({"engine_over_bare": 0.45, "engine_offered_over_bare": 0.5,
                                 "pipeline_over_bare": 0.25})
    assert host_relative({"engine_end_to_end_per_s": 1_800.0}) == {}  # no bare client run


def test_a_new_figure_replaces_its_old_range_and_leaves_other_parts_alone() -> None:
    earlier = {"a_per_s": 1.0, "a_per_s_min": 0.5, "a_per_s_max": 2.0, "a_per_s_rounds": 3.0,
               "b_per_s": 7.0}
    assert merge_results(earlier, {"a_per_s": 4.0}) == {"a_per_s": 4.0, "b_per_s": 7.0}


def _lags(level: float, growth: float, seconds: float = 15) -> list[tuple[float, float]]:
    """A lag sampled every 0.25 s: ``level`` give or take the sink's batches (±300),
    growing by ``growth`` deliveries a second."""
    n = int(seconds * 4)
    return [(t / 4, level + growth * t / 4 + (300 if t % 2 else -300)) for t in range(1, n + 1)]


def test_a_level_lag_is_kept_up() -> None:
    trend, error = lag_trend(_lags(2_000, 0))
    assert abs(trend) < 30 and error < 30
    assert verdict(trend, error, 4_000, 3_995) == KEPT_UP


def test_a_shortfall_is_falling_behind() -> None:
    # offered 4,500/s, on record 4,200/s: 300 more behind every second
    trend, error = lag_trend(_lags(1_000, 300))
    assert trend == pytest.approx(300, abs=30)
    assert verdict(trend, error, 4_500, 4_495) == FELL_BEHIND


def test_a_start_up_catch_up_does_not_hide_a_shortfall_after_it() -> None:
    # 6,000 behind at 2 s, caught up by 1,000/s until 6 s, then 300/s behind until 15 s:
    # one fit from 2 s reads about level; the second half shows the shortfall
    lags = [(t / 4, (6_000 - 1_000 * (t / 4 - 2)) if t / 4 <= 6 else 2_000 + 300 * (t / 4 - 6))
            for t in range(8, 61)]
    trend, error = lag_trend(lags)
    assert verdict(trend, error, 4_000, 3_995) == FELL_BEHIND


def test_a_trend_near_the_limit_is_undecided_and_a_short_bench_is_not_judged() -> None:
    assert verdict(70, 10, 4_000, 3_995) == "UNDECIDED"  # under 80/s, not by 2 errors
    assert verdict(0, 1, 4_000, 3_700).startswith("NOT JUDGED")


def test_the_lag_trend_needs_a_long_enough_run() -> None:
    with pytest.raises(ValueError, match="too few"):
        lag_trend(_lags(2_000, 0, seconds=5))
