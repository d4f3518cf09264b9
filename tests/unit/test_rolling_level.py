"""Today's level: learned from minutes that left the windows, shrunk, bounded, scored."""

from __future__ import annotations

import math

import pytest

from postbacks.core.anomaly.level import (
    MIN_HOURS,
    NO_LEVEL,
    Level,
    age_out,
    close_hour,
    current,
    format_level,
    in_hour,
    parse_level,
)

CV2 = 0.03 ** 2  # the profile's level variation: 3%


def run_hours(lv: Level, hours: int, ratio: float, per_min: float = 1000.0,
              var: float = 1.0) -> Level:
    """``hours`` of minutes at ``ratio`` x expected, through the hour and the ageing."""
    for _ in range(hours):
        for _ in range(60):
            lv = in_hour(lv, ratio * per_min, per_min, var)
            lv = age_out(lv, ratio * per_min, per_min, var)
        lv = close_hour(lv, CV2)
    return lv


def test_no_level_until_enough_hours_are_scored() -> None:
    lv = NO_LEVEL
    while lv.r_den < MIN_HOURS:  # the weighted count of scored hours (about 52 hours)
        assert current(lv, CV2) == (1.0, CV2)
        lv = run_hours(lv, 1, 1.04)
    level, _ = current(lv, CV2)
    assert level == pytest.approx(1.04, abs=0.005)


@pytest.mark.parametrize(("ratio", "level"), [
    (1.0, 1.0),
    (1.03, 1.03),
    (0.96, 0.96),
    (1.5, 1 + 2 * math.sqrt(CV2)),   # bounded: a surge is not "a busy day"
    (0.5, 1 - 2 * math.sqrt(CV2)),
])
def test_the_level_follows_a_steady_day_within_its_bound(ratio: float, level: float) -> None:
    lv = run_hours(NO_LEVEL, 60, ratio)
    assert current(lv, CV2)[0] == pytest.approx(level, abs=0.002)


def test_a_noisy_estimate_is_shrunk_towards_one() -> None:
    quiet = run_hours(NO_LEVEL, 60, 1.04, per_min=10.0, var=1000.0)  # noise >> level
    assert 1.0 < current(quiet, CV2)[0] < 1.02


def test_the_remaining_variation_is_what_the_correction_leaves() -> None:
    base = run_hours(NO_LEVEL, 100, 1.0)
    steady = run_hours(base, 100, 1.04)  # a steady offset: predicted, almost nothing remains
    assert current(steady, CV2)[1] < 1e-4
    lv = base
    for h in range(100):  # alternating +-5% hours: the level cannot predict them
        lv = run_hours(lv, 1, 1.05 if h % 2 else 0.95)
    assert 0.0015 < current(lv, CV2)[1] < 0.004


def test_one_wild_hour_moves_the_remaining_variation_by_at_most_three_sigma() -> None:
    lv = run_hours(NO_LEVEL, 100, 1.0)
    r_before = current(lv, CV2)[1]
    wild = run_hours(lv, 1, 3.0)  # a +200% hour (that did not trip)
    assert current(wild, CV2)[1] <= r_before + 9 * CV2 / wild.r_den + 1e-12


def test_minutes_without_an_expectation_are_ignored() -> None:
    assert age_out(NO_LEVEL, 5.0, float("nan"), 1.0) is NO_LEVEL
    assert in_hour(NO_LEVEL, 5.0, float("nan"), 1.0) is NO_LEVEL


def test_round_trip_and_bad_values() -> None:
    lv = run_hours(NO_LEVEL, 3, 1.02)
    assert parse_level(format_level(lv)) == lv
    for bad in ("1,2,3", "1,2,3,4,5,6,7,8,nan", "a,b,c,d,e,f,g,h,i"):
        with pytest.raises(ValueError):
            parse_level(bad)
