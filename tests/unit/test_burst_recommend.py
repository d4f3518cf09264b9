"""The retrodated burst's calibration: the needed count, the recommendation and the re-run,
on small histories whose answers can be worked out by hand."""

from __future__ import annotations

import random

import pytest

from postbacks.core.anomaly.burst_recommend import (
    MIN_BURST_COUNT,
    calibrate_burst,
    recommend_burst,
)
from postbacks.core.anomaly.retro_burst import BurstPolicy

MIN = 60_000
DAY = 1440
T0 = 29_000_000  # a minute number (about 2025)


def _trickle(days: int, per_minute: float, seed: int = 1) -> dict[int, int]:
    rng = random.Random(seed)
    out: dict[int, int] = {}
    for m in range(T0, T0 + days * DAY):
        n = sum(1 for _ in range(10) if rng.random() < per_minute / 10)
        if n:
            out[m] = n
    return out


def _series(counts: dict[int, int]) -> list[tuple[int, int]]:
    return sorted(counts.items())


def test_a_quiet_history_needs_nothing_and_gets_the_minimum() -> None:
    cal = calibrate_burst([], BurstPolicy())
    assert cal.needed is None and cal.trips_outside == 0 and cal.retrodated == 0
    assert recommend_burst(cal, 0.5).floor == MIN_BURST_COUNT


@pytest.mark.parametrize(("burst", "floor", "trips"), [
    (30, 20, 1),  # a floor under the burst trips on it
    (30, 31, 0),  # one over the whole 15-min span's count: never
    (30, 0, 0),  # the burst off: nothing trips, the needed count is still found
])
def test_the_needed_count_is_the_busiest_span_the_other_conditions_let_through(
        burst: int, floor: int, trips: int) -> None:
    counts = _trickle(7, 0.05)
    at = T0 + 5 * DAY + 600
    for m in range(at - 20, at + 30):  # nothing else near it
        counts.pop(m, None)
    for m in range(at, at + 10):  # 3 a minute for 10 minutes
        counts[m] = counts.get(m, 0) + 3
    total = sum(counts.get(m, 0) for m in range(at - 5, at + 10))  # the span ending at +9
    assert total >= burst
    cal = calibrate_burst(_series(counts), BurstPolicy(floor=floor))
    assert cal.needed is not None and cal.needed.count == total
    assert cal.needed.at_ms == (at + 10) * MIN
    assert cal.trips_outside == trips
    rec = recommend_burst(cal, 0.5)
    assert rec.floor == max(MIN_BURST_COUNT, -(-total * 3 // 2))
    again = calibrate_burst(_series(counts), rec)
    assert again.trips_outside == 0 and again.first_trip_ms is None


def test_a_labelled_incident_is_left_out_and_its_trip_time_reported() -> None:
    counts = _trickle(14, 0.2)  # about 3 in a 15-min span
    start = T0 + 10 * DAY + 300
    for m in range(start - 15, start):  # the span before it quiet: a known trip minute
        counts.pop(m, None)
    for m in range(start, start + 60):
        counts[m] = counts.get(m, 0) + 12
    incident = (start * MIN, (start + 60) * MIN)
    policy = BurstPolicy(floor=5, k=1.0, multiple=1.5)
    cal = calibrate_burst(_series(counts), policy, incident=incident)
    assert cal.needed is not None and cal.needed.count < 20  # the noise, not the incident
    assert cal.trips_outside > 0  # a floor of 5 trips on the trickle's noise
    rec = recommend_burst(cal, 0.5)
    again = calibrate_burst(_series(counts), rec, incident=incident)
    assert again.trips_outside == 0
    # 12 a minute over a floor of 20: the second minute of the incident
    assert again.incident_trip_ms == (start + 2) * MIN
    assert cal.incident_trip_ms == (start + 1) * MIN  # 12 over a floor of 5: its first


def test_a_span_still_over_after_its_burst_stops_is_one_episode() -> None:
    # each alone over 30; a month on, the first two have left the usual rate
    counts = {T0: 40, T0 + 3: 40, T0 + 30 * DAY: 40}
    cal = calibrate_burst(_series(counts), BurstPolicy(floor=30))
    # T0 and T0+3 share a span: one episode; a month on, a span of its own: a second
    assert cal.trips_outside == 2 and cal.first_trip_ms == (T0 + 1) * MIN
    assert cal.needed is not None and cal.needed.count == 80


@pytest.mark.parametrize("series", [
    [(T0, 1), (T0, 2)],  # a minute twice
    [(T0 + 1, 1), (T0, 2)],  # out of order
    [(T0, -1)],  # negative
])
def test_a_malformed_series_is_refused(series: list[tuple[int, int]]) -> None:
    with pytest.raises(ValueError, match="oldest first"):
        calibrate_burst(series, BurstPolicy())


def test_a_negative_margin_is_refused() -> None:
    with pytest.raises(ValueError, match="margin"):
        recommend_burst(calibrate_burst([], BurstPolicy()), -0.1)


def test_the_incident_teaches_the_usual_rate_nothing() -> None:
    """After an hour of 30 retrodated deliveries a minute (labelled), a batch of 25 in one
    minute is still judged against a usual of nearly nothing, as the gate, halted through
    the incident, would judge it."""
    start = T0 + 1000
    counts = {m: 30 for m in range(start, start + 60)}
    counts[T0 + 1200] = 25
    incident = (start * MIN, (start + 60) * MIN)
    cal = calibrate_burst(_series(counts), BurstPolicy(), incident=incident)
    assert cal.needed is not None and cal.needed.count == 25 and cal.needed.usual < 1
    unlabelled = calibrate_burst(_series(counts), BurstPolicy())
    assert unlabelled.needed is not None and unlabelled.needed.count > 400  # the incident
