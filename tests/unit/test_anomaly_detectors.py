"""Detectors: the retrodating rule, input parsing, multiple AND floor, mid-window trips."""

from __future__ import annotations

import pytest

from postbacks.core.anomaly.baseline import SeasonalBaseline, add, close_until, empty
from postbacks.core.anomaly.detectors import (
    MISSING_PAYOUT,
    NO_BASELINE,
    RETRODATING_WINDOW_MS,
    WITHIN,
    MissingInputs,
    Over,
    RateThresholds,
    as_ms,
    observe,
    payout_input,
    retrodated,
    trips,
    value_rate,
)
from postbacks.core.anomaly.windows import DAY_MS, HOUR_MS, WEEK_MS

MON9 = 1_772_409_600_000 + 9 * HOUR_MS
USD = 1_000_000
T = 1_700_000_000_000


@pytest.mark.parametrize(("created", "completed", "expected"), [
    (T, T - 60_000, False),                               # minutes: normal
    (T, T - RETRODATING_WINDOW_MS, False),                # exactly the window: not "exceeds"
    (T, T - RETRODATING_WINDOW_MS - 1, True),
    (T, T - 30 * DAY_MS, True),                           # weeks (IR-307)
    (T, T + DAY_MS, False),                               # completed after creation
    (str(T), str(T - 30 * DAY_MS), True),                 # integer strings parse
    (float(T), float(T - 60_000), False),
    (None, T, MissingInputs(("source_created_at",))),
    (T, None, MissingInputs(("source_completed_at",))),
    (None, None, MissingInputs(("source_created_at", "source_completed_at"))),
    ("2026-03-02", T, MissingInputs(("source_created_at",), ("source_created_at",))),
    (T, True, MissingInputs(("source_completed_at",), ("source_completed_at",))),
    (T, float("nan"), MissingInputs(("source_completed_at",), ("source_completed_at",))),
    (T, 1.5, MissingInputs(("source_completed_at",), ("source_completed_at",))),
    # ISO-8601 with an offset is a time; without one, or out of range, it is not
    ("2023-11-14T22:13:20Z", "2023-10-15T22:13:20+00:00", True),
    ("2023-11-14T23:13:20+01:00", T - 60_000, False),
    ("2023-11-14T22:13:20", T, MissingInputs(("source_created_at",), ("source_created_at",))),
    (-5, T, MissingInputs(("source_created_at",), ("source_created_at",))),
    (10**17, None, MissingInputs(("source_created_at", "source_completed_at"),
                                 ("source_created_at",))),
    (None, "garbage", MissingInputs(("source_created_at", "source_completed_at"),
                                    ("source_completed_at",))),
])
def test_retrodated(created: object, completed: object, expected: bool | MissingInputs) -> None:
    assert retrodated(created, completed) == expected


def test_missing_inputs_name_their_fields() -> None:
    got = retrodated(None, "soon")
    assert isinstance(got, MissingInputs)
    assert got.describe() == "source_created_at (missing), source_completed_at (unparseable)"


def test_retrodating_window_is_configurable() -> None:
    assert retrodated(T, T - 2 * DAY_MS, window_ms=DAY_MS) is True
    assert retrodated(T, T - 2 * DAY_MS) is False


BAD_PAYOUT = MissingInputs(("payout_usd_micros",), ("payout_usd_micros",))


@pytest.mark.parametrize(("value", "expected"), [
    (1_250_000, 1_250_000), (0, 0), ("2500000", 2_500_000), (-1, BAD_PAYOUT),
    (None, MISSING_PAYOUT), ("1.25", BAD_PAYOUT), (False, BAD_PAYOUT),
])
def test_payout_input(value: object, expected: int | MissingInputs) -> None:
    assert payout_input(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    (5, 5), (" 7 ", 7), (5.0, 5), (5.5, None), (float("inf"), None), (b"5", None), ([], None),
])
def test_as_ms(value: object, expected: int | None) -> None:
    assert as_ms(value) == expected


TH = RateThresholds(multiple=3.0, floor_micros=500 * USD)


@pytest.mark.parametrize(("observed", "base", "expected"), [
    (2_000 * USD, 500.0 * USD, True),   # 4x and over the floor
    (1_500 * USD, 500.0 * USD, False),  # exactly 3x is not over
    (1_501 * USD, 500.0 * USD, True),
    (400 * USD, 10.0 * USD, False),     # 40x but under the floor: low volume never trips
    (500 * USD, 0.0, False),            # exactly the floor on a zero baseline
    (501 * USD, 0.0, True),             # over the floor on a quiet hour
    (900 * USD, 400.0 * USD, False),    # over the floor but only 2.25x
    (10_000 * USD, None, False),        # no baseline: cannot trip
])
def test_multiple_and_floor(observed: int, base: float | None, expected: bool) -> None:
    assert trips(observed, base, TH) is expected


def _with_history(weekly_total: int, weeks: int = 4) -> SeasonalBaseline:
    s = empty()
    for k in range(weeks):
        s = add(s, MON9 + k * WEEK_MS, weekly_total)
    return close_until(s, MON9 + weeks * WEEK_MS)


def test_trips_mid_window_as_the_total_accumulates() -> None:
    s = _with_history(200 * USD)  # baseline $200: trips over max(3 x 200, 500) = $600
    results = []
    for minute in range(0, 60, 5):  # $100 every five minutes
        s = add(s, MON9 + 4 * WEEK_MS + minute * 60_000, 100 * USD)
        results.append(value_rate(s, TH))
    first = next(i for i, r in enumerate(results) if isinstance(r, Over))
    assert first == 6  # the 7th payout: $700 > $600, at minute 30 of the hour
    assert results[first] == Over(MON9 + 4 * WEEK_MS, 700 * USD, 200.0 * USD)
    assert all(r is WITHIN for r in results[:first])


def test_low_volume_endpoint_never_trips_on_noise() -> None:
    s = _with_history(1 * USD)  # ~$1 an hour
    s = add(s, MON9 + 4 * WEEK_MS, 60 * USD)  # 60x the baseline, far below the floor
    assert value_rate(s, TH) is WITHIN


@pytest.mark.parametrize(("weeks", "expected_none"), [(0, True), (1, True), (2, False)])
def test_no_history_no_trip(weeks: int, expected_none: bool) -> None:
    s = _with_history(1 * USD, weeks)
    s = add(s, MON9 + weeks * WEEK_MS, 10_000 * USD)
    assert (value_rate(s, TH) is NO_BASELINE) is expected_none


def test_observe_adds_then_evaluates_and_skips_missing_payout() -> None:
    s = _with_history(100 * USD)
    s2, r = observe(s, MON9 + 4 * WEEK_MS, 1_000 * USD, TH)
    assert isinstance(r, Over) and s2.open_total == 1_000 * USD
    s3, r = observe(s2, MON9 + 4 * WEEK_MS, None, TH)
    assert r == MISSING_PAYOUT and s3 is s2


def test_thresholds_validate() -> None:
    with pytest.raises(ValueError):
        RateThresholds(multiple=0)
    with pytest.raises(ValueError):
        RateThresholds(floor_micros=-1)
