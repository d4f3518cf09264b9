"""Calibration of the global rolling detector (pure): needed k per span, the enforce
simulation, and the recommendation that gives zero trips on the same history."""

from __future__ import annotations

import math
import random

import pytest

from postbacks.core.anomaly.recommend import (
    MIN_H,
    MIN_K,
    calibrate,
    needed_h,
    needed_k,
    recommend,
)
from postbacks.core.anomaly.rolling import GLOBAL_ROLLING, RollingThresholds, SpanScore
from streams.anomaly_gate.calibrate_common import minute_of

USD = 1_000_000
WEEK_MIN = 7 * 24 * 60
M0 = 28_000_000 - 28_000_000 % WEEK_MIN  # a week boundary, in minutes since the epoch


def span(span: int = 5, observed: float = 200, expected: float = 100, score: float = 6.0,
         count_score: float = 0.0) -> SpanScore:
    return SpanScore(span, span, int(observed * USD), expected * USD, 10 * USD, score,
                     0, 0.0, count_score)


@pytest.mark.parametrize(("sc", "want"), [
    (span(score=6.0), (6.0 - 3.0 / math.sqrt(5), "value")),
    (span(span=60, score=6.0), (6.0 - 3.0 / math.sqrt(60), "value")),
    # the count channel needs the value score above support_k (2)
    (span(score=2.5, count_score=9.0), (9.0 - 2.0 / math.sqrt(5), "count")),
    (span(score=1.5, count_score=9.0), (1.5 - 3.0 / math.sqrt(5), "value")),
    # not over multiple x expected, or not over the floor: no k trips it
    (span(observed=105, expected=100), None),
    (span(observed=130, expected=100), None),  # excess 30 USD < the 50 USD floor
])
def test_needed_k(sc: SpanScore, want: tuple[float, str] | None) -> None:
    got = needed_k(sc, GLOBAL_ROLLING)
    if want is None:
        assert got is None
    else:
        assert got is not None and got[1] == want[1] and got[0] == pytest.approx(want[0])


def _history(weeks: int, rng: random.Random, surge: tuple[int, int, float] | None = None
             ) -> list[tuple[int, int, int]]:
    """Noisy diurnal traffic a minute at a time; ``surge``: (from, to, multiple) minutes."""
    out = []
    for i in range(weeks * WEEK_MIN):
        lam = 6 * (1 + 0.5 * math.sin(2 * math.pi * (i % 1440) / 1440))
        if surge and surge[0] <= i < surge[1]:
            lam *= surge[2]
        n = sum(1 for _ in range(40) if rng.random() < lam / 40)
        out.append((M0 + i, sum(int(rng.lognormvariate(0.7, 0.8) * USD) for _ in range(n)), n))
    return out


def test_a_low_k_trips_on_noise_and_the_recommendation_trips_nothing() -> None:
    hist = _history(4, random.Random(7))
    low = RollingThresholds(k=0.5, skew=0.0, multiple=1.05, floor_micros=5 * USD,
                            cusum_h=0.5)
    cal = calibrate(hist, low)
    assert sum(d.trips for d in cal.days.values()) > 0
    assert cal.first_trip_ms is not None
    first_trip_day = min(d for d, r in cal.days.items() if r.trips)
    later = [r for d, r in cal.days.items() if d > first_trip_day]
    assert later and all(r.held_count == r.count for r in later)  # halted, nobody closed it
    assert cal.needed is not None
    rec = recommend(cal, margin=0.5)
    assert rec.k >= max(MIN_K, cal.needed.k + 0.5) - 0.01
    assert cal.needed_h is not None and cal.needed_h.channel.startswith("count +")
    assert rec.cusum_h >= max(MIN_H, cal.needed_h.k + 2.0) - 0.01
    again = calibrate(hist, rec)
    assert sum(d.trips for d in again.days.values()) == again.trips_outside == 0
    assert sum(d.held_micros for d in again.days.values()) == 0


def test_an_incident_is_left_out_of_the_recommendation_and_its_trip_reported() -> None:
    start = 3 * WEEK_MIN + 600
    hist = _history(4, random.Random(3), surge=(start, start + 360, 3.0))
    incident = ((M0 + start) * 60_000, (M0 + start + 360) * 60_000)
    cal = calibrate(hist, GLOBAL_ROLLING, incident=incident)
    rec = recommend(cal)
    again = calibrate(hist, rec, incident=incident)
    assert again.incident_trip_ms is not None
    assert again.incident_trip_ms - incident[0] <= 10 * 60_000  # x3 trips within minutes
    assert again.trips_outside == 0
    assert again.first_trip_ms == again.incident_trip_ms
    # without the label, the surge's own scores would set the recommendation
    unlabelled = recommend(calibrate(hist, GLOBAL_ROLLING))
    assert unlabelled.k > rec.k


def test_the_margin_and_the_minimum() -> None:
    cal = calibrate(_history(3, random.Random(1)), GLOBAL_ROLLING)
    assert recommend(cal, margin=0.0).k >= MIN_K
    assert recommend(cal, margin=2.0).k >= recommend(cal, margin=0.0).k
    with pytest.raises(ValueError, match="margin"):
        recommend(cal, margin=-1)
    with pytest.raises(ValueError, match="margin"):
        recommend(cal, h_margin=-1)
    assert recommend(cal, h_margin=0.0).cusum_h >= MIN_H


@pytest.mark.parametrize(("sc", "want"), [
    (SpanScore(9, 9, 200 * USD, 100 * USD, 10 * USD, 7.5, 0, 0.0, 7.5, "count +50%"), 7.5),
    # at zero, under the multiple, under the floor, or without the value's support
    (SpanScore(0, 0, 0, 0.0, 0.0, 0.0, 0, 0.0, 0.0, "count +50%"), None),
    (SpanScore(9, 9, 105 * USD, 100 * USD, 1 * USD, 7.5, 0, 0.0, 7.5, "count +50%"), None),
    (SpanScore(9, 9, 130 * USD, 100 * USD, 1 * USD, 7.5, 0, 0.0, 7.5, "count +50%"), None),
    (SpanScore(9, 9, 200 * USD, 100 * USD, 60 * USD, 7.5, 0, 0.0, 7.5, "count +25%"), None),
])
def test_needed_h(sc: SpanScore, want: float | None) -> None:
    assert needed_h(sc, GLOBAL_ROLLING) == want


@pytest.mark.parametrize(("occurred_at", "payout", "got"), [
    (1_700_000_060_000, 5, (28_333_334, 5)),
    ("2023-11-14T22:14:20Z", 0, (28_333_334, 0)),
    (1_700_000_060_000, 10**12, (28_333_334, 10**12)),
    (1_700_000_060_000, 10**12 + 1, None),  # over USD 1M: the gate does not count it
    (1_700_000_060_000, -1, None),
    (1_700_000_060_000, None, None),
    (1_700_000_060, 5, None),  # epoch seconds: before 2000
    ("yesterday", 5, None),
])
def test_calibration_counts_what_the_gate_counts(occurred_at: object, payout: object,
                                                 got: tuple[int, int] | None) -> None:
    assert minute_of(occurred_at, payout) == got
