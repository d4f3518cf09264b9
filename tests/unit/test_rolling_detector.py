"""Rolling detector: surges trip within minutes, normal noise never does, state round-trips."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from postbacks.core.anomaly.detectors import NO_BASELINE, WITHIN, Over
from postbacks.core.anomaly.profile import MINUTE_MS
from postbacks.core.anomaly.rolling import (
    ENDPOINT_ROLLING,
    GLOBAL_ROLLING,
    NO_PROFILE,
    RollingOver,
    RollingState,
    RollingThresholds,
    RollingWithin,
    add,
    as_rate_result,
    empty,
    evaluate,
)
from postbacks.core.anomaly.rolling_codec import from_dict, to_dict
from streams.anomaly_gate.history import poisson

MON_MIN = 1_772_409_600_000 // MINUTE_MS  # 2026-03-02T00:00Z, a Monday, in minutes
WEEK = 7 * 1440
_PAYOUTS = (250_000,) * 20 + (1_000_000,) * 16 + (2_000_000,) * 12 + (5_000_000,) * 6 + (
    20_000_000,)


def rate(minute: int, mean: float) -> float:
    """Conversions per minute: diurnal (peak 15:00, trough 03:00 at 40%), weekend dip."""
    hours = (minute - MON_MIN) / 60
    diurnal = 1 + 0.6 * math.cos(2 * math.pi * (hours % 24 - 15) / 24)
    return mean * diurnal * (0.8 if int(hours // 24) % 7 >= 5 else 1.06)


def minute_of_traffic(rng: random.Random, minute: int, mean: float, level: float,
                      extra: float = 0.0) -> tuple[int, int]:
    n = poisson(rng, rate(minute, mean) * level * (1 + extra), gauss_above=30.0)
    return sum(rng.choices(_PAYOUTS, k=n)), n


def history(seed: int, weeks: int = 3, mean: float = 100.0) -> tuple[RollingState, int]:
    """``weeks`` of seasonal traffic with a per-day level (sd 3%); state and next minute."""
    rng = random.Random(seed)
    s = empty()
    level = 1.0
    for m in range(MON_MIN, MON_MIN + weeks * WEEK):
        if (m - MON_MIN) % 1440 == 0:
            level = rng.lognormvariate(0, 0.03)
        total, n = minute_of_traffic(rng, m, mean, level)
        s = add(s, m * MINUTE_MS, total, n)
    return s, MON_MIN + weeks * WEEK


_HISTORIES: dict[int, tuple[RollingState, int]] = {}


def cached_history(seed: int) -> tuple[RollingState, int]:
    if seed not in _HISTORIES:
        _HISTORIES[seed] = history(seed)
    return _HISTORIES[seed]


def run(s: RollingState, first: int, minutes: int, rng: random.Random, th: RollingThresholds,
        extra_from: int | None = None, extra: float = 0.0,
        mean: float = 100.0) -> tuple[RollingState, int | None]:
    """Feed minutes, evaluating after each; the first minute (offset) that trips, or None."""
    for i in range(minutes):
        m = first + i
        ex = extra if extra_from is not None and i >= extra_from else 0.0
        total, n = minute_of_traffic(rng, m, mean, 1.0, ex)
        s = add(s, m * MINUTE_MS, total, n)
        if isinstance(evaluate(s, th), RollingOver):
            return s, i
    return s, None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_week_of_normal_traffic_never_trips(seed: int) -> None:
    s, first = cached_history(seed)
    _, tripped = run(s, first, WEEK, random.Random(seed + 100), GLOBAL_ROLLING)
    assert tripped is None


@pytest.mark.parametrize(("seed", "hour", "excess", "within"), [
    (1, 15, 1.0, 5),    # Monday 15:00 (peak), +100%
    (2, 15, 0.5, 10),   # +50%
    (3, 10, 0.5, 10),
    (1, 3, 1.0, 10),    # the trough: less volume, more noise
    (2, 20, 4.0, 5),    # +400%
])
def test_a_surge_starting_at_minute_50_trips_within_the_next_windows(
        seed: int, hour: int, excess: float, within: int) -> None:
    s, first = cached_history(seed)
    start = hour * 60 + 50  # minutes into the Monday
    rng = random.Random(seed + 200)
    s, tripped = run(s, first, start + 60, rng, GLOBAL_ROLLING, extra_from=start,
                     extra=excess)
    assert tripped is not None
    assert start <= tripped < start + within, tripped - start


def test_the_trip_names_the_span_and_its_numbers() -> None:
    s, first = cached_history(1)
    rng = random.Random(7)
    start = 15 * 60 + 50
    s, tripped = run(s, first, start + 60, rng, GLOBAL_ROLLING, extra_from=start, extra=1.0)
    r = evaluate(s, GLOBAL_ROLLING)
    assert isinstance(r, RollingOver) and tripped is not None
    over = r.over
    assert over.observed_micros > GLOBAL_ROLLING.multiple * over.expected_micros
    th = GLOBAL_ROLLING
    assert over.score > th.k_for(over.span) or (
        over.count_score > th.count_k_for(over.span) and over.score > th.support_k)
    assert r.window_start_ms == (first + tripped - over.seen + 1) * MINUTE_MS
    assert [sc.span for sc in r.scores] == [5, 15, 60]
    assert as_rate_result(r) == Over(r.window_start_ms, over.observed_micros,
                                     over.expected_micros)
    assert as_rate_result(RollingWithin(r.scores)) is WITHIN
    assert as_rate_result(NO_PROFILE) is NO_BASELINE


def _fresh_ring(s: RollingState) -> RollingState:
    """The profile alone, as after a restart that kept no minutes (a gate starting)."""
    return dataclasses.replace(empty(s.policy), profile=s.profile, st=s.st, cst=s.cst)


@pytest.mark.parametrize(("factor", "trips"), [(1.0, False), (1.2, False), (4.0, True)])
def test_a_partial_window_is_judged_on_the_part_seen(factor: float, trips: bool) -> None:
    s, first = cached_history(2)
    s = _fresh_ring(s)
    m = first + 15 * 60  # Monday 15:00
    rng = random.Random(3)
    results = []
    for i in range(3):
        total, n = minute_of_traffic(rng, m + i, 100.0, 1.0, factor - 1)
        s = add(s, (m + i) * MINUTE_MS, total, n)
        results.append(evaluate(s, GLOBAL_ROLLING))
    last = results[-1]
    sixty = next(sc for sc in last.scores if sc.span == 60)  # type: ignore[union-attr]
    assert sixty.seen == 3
    mean_payout = sum(_PAYOUTS) / len(_PAYOUTS)
    assert sixty.expected_micros == pytest.approx(3 * 100 * 1.6 * 1.06 * mean_payout, rel=0.1)
    assert isinstance(last, RollingOver) is trips


def test_one_large_payout_does_not_trip_the_global_scope() -> None:
    s, first = cached_history(3)
    rng = random.Random(4)
    s, tripped = run(s, first, 3 * 60, rng, GLOBAL_ROLLING)  # Monday 00:00-03:00
    assert tripped is None
    s = add(s, (first + 3 * 60) * MINUTE_MS, 2_000_000_000)  # one $2,000 payout at 03:00
    assert isinstance(evaluate(s, GLOBAL_ROLLING), RollingWithin)


@pytest.mark.parametrize(("burst_usd", "trips"), [(150, False), (600, True)])
def test_the_floor_keeps_a_small_endpoint_from_tripping_on_small_money(
        burst_usd: int, trips: bool) -> None:
    rng = random.Random(5)
    s = empty()
    for m in range(MON_MIN, MON_MIN + 2 * WEEK):  # ~one $2 conversion every 5 minutes
        total, n = minute_of_traffic(rng, m, 0.2, 1.0)
        s = add(s, m * MINUTE_MS, total, n)
    m = MON_MIN + 2 * WEEK + 15 * 60
    for i in range(5):
        s = add(s, (m + i) * MINUTE_MS, burst_usd * 200_000)
    r = evaluate(s, ENDPOINT_ROLLING)
    assert isinstance(r, RollingOver) is trips
    assert max(sc.score for sc in r.scores) > ENDPOINT_ROLLING.k_for(5)  # type: ignore[union-attr]


def test_state_round_trips_through_json_and_continues_the_same() -> None:
    s, first = cached_history(1)
    s, _ = run(s, first, 95, random.Random(6), GLOBAL_ROLLING)
    d = to_dict(s)
    back = from_dict(json.loads(json.dumps(d)))
    assert to_dict(back) == d
    assert evaluate(back, GLOBAL_ROLLING) == evaluate(s, GLOBAL_ROLLING)
    a, _ = run(s, first + 95, 130, random.Random(8), GLOBAL_ROLLING)
    b, _ = run(back, first + 95, 130, random.Random(8), GLOBAL_ROLLING)
    assert to_dict(a) == to_dict(b)
    assert len(json.dumps(d)) < 40_000


def test_an_empty_state_round_trips() -> None:
    d = to_dict(empty())
    assert "minute" not in d
    assert to_dict(from_dict(d)) == d


@pytest.mark.parametrize(("change", "message"), [
    ({"v": 2}, "unknown format"),
    ({"spans": "5,x"}, "rolling state"),
    ({"weeks": "4"}, "'weeks' must be an int"),
    ({"cur": 1.5}, "'cur' must be an int"),
    ({"obs": "1,2"}, "different lengths"),
    ({"cexp": "1.0"}, "different lengths"),
    ({"ccur": None}, "'ccur' must be an int"),
    ({"profile": "1:2:3"}, "slots"),
    ({"profile": ";" * 167 + "1:2:3"}, "rolling state"),
    ({"profile": ";" * 167 + "1:-2:3:4"}, "bad hour"),
    ({"profile": ";" * 167 + "1:2:3:-4"}, "bad hour"),
    ({"minute": "12"}, "'minute' must be an int"),
    ({"h_sq": "x"}, "must be a number"),
])
def test_malformed_state_is_refused(change: dict[str, object], message: str) -> None:
    s = add(empty(), MON_MIN * MINUTE_MS, 1)
    d = {**to_dict(s), **change}
    with pytest.raises(ValueError, match=message):
        from_dict(d)  # type: ignore[arg-type]


def test_since_minute_keeps_every_span_from_reaching_back_before_it() -> None:
    """A surge before ``since_minute`` (a halt closed after it) trips without the bound and
    not with it; a span then covers only the minutes from ``since_minute``."""
    s, first = cached_history(2)
    m = first + 15 * 60
    rng = random.Random(5)
    for i in range(15):  # +300 % for 10 minutes, then 5 normal minutes
        total, n = minute_of_traffic(rng, m + i, 100.0, 1.0, 3.0 if i < 10 else 0.0)
        s = add(s, (m + i) * MINUTE_MS, total, n)
    open_minute = m + 14
    assert isinstance(evaluate(s, GLOBAL_ROLLING), RollingOver)
    bounded = evaluate(s, GLOBAL_ROLLING, since_minute=m + 12)
    assert isinstance(bounded, RollingWithin)
    assert {sc.span: sc.seen for sc in bounded.scores} == {5: 3, 15: 3, 60: 3}
    assert evaluate(s, GLOBAL_ROLLING, since_minute=open_minute + 1) is NO_PROFILE
    assert evaluate(s, GLOBAL_ROLLING, since_minute=m - 100) == evaluate(s, GLOBAL_ROLLING)
