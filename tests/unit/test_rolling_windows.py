"""Rolling windows: the hour-of-week profile, per-minute interpolation, span arithmetic."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest

from postbacks.core.anomaly.profile import (
    SLOTS,
    Profile,
    close_hour,
    count_stats,
    expect_minute,
    slot_of_hour,
    stats,
)
from postbacks.core.anomaly.rolling import (
    NO_PROFILE,
    RollingPolicy,
    RollingState,
    RollingThresholds,
    RollingWithin,
    SpanScore,
    add,
    advance,
    empty,
    evaluate,
)

MON = 1_772_409_600_000  # 2026-03-02T00:00:00Z, a Monday
MIN = 60_000
MON_MIN = MON // MIN  # minutes since the epoch
MON_HOUR = MON_MIN // 60
NEVER = RollingThresholds(k=1e9)  # scores only


def profile_of(hourly: Callable[[int], float], weeks: int = 4) -> Profile:
    """Every slot ``weeks`` times the same hour: total ``hourly(slot)``, smooth minutes,
    one conversion per $1."""
    out = []
    for slot in range(SLOTS):
        total = round(hourly(slot))
        n = max(1, total // 1_000_000)
        out.append(((total, n, 60 * (total / 60) ** 2, round(60 * (n / 60) ** 2)),) * weeks)
    return tuple(out)


def state_with(hourly: Callable[[int], float], weeks: int = 4,
               policy: RollingPolicy | None = None) -> RollingState:
    s = empty(policy)
    p = profile_of(hourly, weeks)
    return dataclasses.replace(s, profile=p, st=stats(p, s.policy.min_weeks),
                               cst=count_stats(p, s.policy.min_weeks))


def feed(s: RollingState, first_minute: int, per_minute: list[int]) -> RollingState:
    for i, v in enumerate(per_minute):
        s = add(s, (first_minute + i) * MIN + 1_000, v)
    return s


def span(result: object, minutes: int) -> SpanScore:
    assert isinstance(result, RollingWithin), result
    return next(sc for sc in result.scores if sc.span == minutes)


@pytest.mark.parametrize(("hour_index", "slot"), [
    (MON_HOUR, 0),                  # Monday 00:00
    (MON_HOUR + 1, 1),
    (MON_HOUR + 24 + 15, 39),       # Tuesday 15:00
    (MON_HOUR + 6 * 24 + 23, 167),  # Sunday 23:00
    (MON_HOUR + 7 * 24, 0),         # next Monday
])
def test_slot_of_hour(hour_index: int, slot: int) -> None:
    assert slot_of_hour(hour_index) == slot


def _step(slot: int) -> float:  # Monday 00:00 = $60/h ($1/min), 01:00 = $120/h, else $60
    return 120e6 if slot == 1 else 60e6


@pytest.mark.parametrize(("minute", "expected"), [
    (MON_MIN + 29, 1e6),                        # centre of hour 0: its own rate...
    (MON_MIN + 30, 1e6 * (1 - 0.5 / 60) + 2e6 * 0.5 / 60),   # ...then the next hour blends in
    (MON_MIN + 59, 1e6 * (1 - 29.5 / 60) + 2e6 * 29.5 / 60),  # last minute before 01:00
    (MON_MIN + 60, 2e6 * (1 - 29.5 / 60) + 1e6 * 29.5 / 60),  # first minute of 01:00
    (MON_MIN + 89, 2e6 * (1 - 0.5 / 60) + 1e6 * 0.5 / 60),
    (MON_MIN + 119, 2e6 * (1 - 29.5 / 60) + 1e6 * 29.5 / 60),
    (MON_MIN - 1, 1e6),                         # Sunday 23:59 blends with Monday 00:00 (same)
])
def test_expected_rate_is_interpolated_across_hour_boundaries(minute: int,
                                                               expected: float) -> None:
    st = stats(profile_of(_step), 2)
    got = expect_minute(st, minute)
    assert got is not None
    assert got[0] == pytest.approx(expected)


def test_no_step_at_an_hour_boundary() -> None:
    st = stats(profile_of(_step), 2)
    before, after = expect_minute(st, MON_MIN + 59), expect_minute(st, MON_MIN + 60)
    assert before is not None and after is not None
    assert after[0] - before[0] == pytest.approx(1e6 / 60)  # one minute's slope, not 1e6


@pytest.mark.parametrize("slope", [0.0, 1e6, -2e5, 7.5e6])
def test_a_linear_trend_keeps_every_hours_total(slope: float) -> None:
    st = stats(profile_of(lambda slot: 500e6 + slope * (slot % 24 - 12)), 2)
    hour = MON_MIN + 10 * 60  # Monday 10:00, neighbours on the same line
    total = math.fsum(e[0] for m in range(hour, hour + 60)
                      if (e := expect_minute(st, m)) is not None)
    assert total == pytest.approx(500e6 + slope * (10 - 12))


def test_no_expectation_below_min_weeks_and_a_missing_neighbour_leaves_the_own_rate() -> None:
    p = profile_of(lambda _: 60e6, weeks=1)  # one sample everywhere
    p2 = close_hour(p, 5, (120_000_000, 10, 0.0, 0), 4)  # slot 5 now has two samples
    st = stats(p2, 2)
    assert expect_minute(st, MON_MIN + 4 * 60) is None  # slot 4: one sample
    got = expect_minute(st, MON_MIN + 5 * 60 + 59)  # slot 5, next (6) has no mean
    assert got is not None
    assert got[0] == pytest.approx((60e6 + 120e6) / 2 / 60)


@pytest.mark.parametrize(("minutes", "spans_seen"), [
    (1, {5: 1, 15: 1, 60: 1}),       # the first minute: every window is partial
    (3, {5: 3, 15: 3, 60: 3}),
    (5, {5: 5, 15: 5, 60: 5}),
    (14, {5: 5, 15: 14, 60: 14}),
    (59, {5: 5, 15: 15, 60: 59}),
    (60, {5: 5, 15: 15, 60: 60}),
    (200, {5: 5, 15: 15, 60: 60}),
])
def test_window_arithmetic_and_partial_windows(minutes: int, spans_seen: dict[int, int]) -> None:
    s = feed(state_with(lambda _: 60e6), MON_MIN + 600, [1_000_000 + i for i in range(minutes)])
    r = evaluate(s, NEVER)
    for w, seen in spans_seen.items():
        sc = span(r, w)
        assert sc.seen == seen
        assert sc.observed_micros == sum(1_000_000 + i for i in range(minutes - seen, minutes))
        assert sc.expected_micros == pytest.approx(1e6 * seen, rel=1e-4)  # only the part seen


def test_the_open_minute_is_expected_pro_rata() -> None:
    s = feed(state_with(lambda _: 60e6), MON_MIN + 600, [1_000_000] * 10)
    start = (MON_MIN + 609) * MIN
    for now, exp in ((start, 9e6), (start + 30_000, 9.5e6), (start + MIN, 10e6),
                     (start + 10 * MIN, 10e6), (None, 10e6)):
        assert span(evaluate(s, NEVER, now), 15).expected_micros == pytest.approx(exp)


def test_quiet_minutes_count_as_zero_and_late_events_count_now() -> None:
    s = feed(state_with(lambda _: 60e6), MON_MIN + 600, [1_000_000])
    s = add(s, (MON_MIN + 604) * MIN, 3_000_000)  # minutes 601..603 had nothing
    assert s.obs[-4:] == (1_000_000, 0, 0, 0)
    s = add(s, (MON_MIN + 590) * MIN, 500_000)  # late: counts in the open minute
    assert s.cur == 3_500_000
    sc = span(evaluate(s, NEVER), 5)
    assert (sc.seen, sc.observed_micros) == (5, 4_500_000)


def test_a_long_gap_keeps_only_the_last_span_of_minutes() -> None:
    s = feed(state_with(lambda _: 60e6), MON_MIN + 600, [1_000_000] * 30)
    s = advance(s, MON_MIN + 600 + 5 * 60)  # five quiet hours later
    assert len(s.obs) == s.policy.ring == 59
    assert set(s.obs) == {0}
    assert s.minute == MON_MIN + 900


def test_an_hour_closes_into_its_slot_with_count_and_squares() -> None:
    s = empty(RollingPolicy(weeks=2, min_weeks=1))
    for i in range(60):
        s = add(s, (MON_MIN + 120 + i) * MIN, 1_000_000 * (1 + i % 2))
    s = add(s, (MON_MIN + 180) * MIN, 5)  # the next hour opens: 02:00 closes
    total = 30 * 1_000_000 + 30 * 2_000_000
    assert s.profile[2] == ((total, 60, 30 * 1e12 + 30 * 4e12, 60),)
    assert s.st.slots[2].mean == total
    assert s.st.slots[2].minute_var == pytest.approx((150e12 - 60 * 1.5e6 ** 2) / 59)
    assert s.h_total == 5 and s.h_count == 1


def test_a_minutes_expectation_is_fixed_when_it_closes() -> None:
    s = empty(RollingPolicy(weeks=2, min_weeks=1))
    p = profile_of(lambda _: 60e6, 1)
    s = dataclasses.replace(s, profile=p, st=stats(p, 1), cst=count_stats(p, 1))
    s = feed(s, MON_MIN + 150, [10_000_000] * 30)  # 02:30..02:59, ten times the rate
    before = s.exp[-1]
    s = add(s, (MON_MIN + 180) * MIN, 1)  # 02:00 closes into the profile (a higher mean)
    assert s.exp[-2] == before  # the minutes already seen keep their expectation
    assert s.st.slots[2].mean is not None and s.st.slots[2].mean > 60e6


def test_a_scope_without_history_has_no_profile() -> None:
    assert evaluate(empty(), RollingThresholds()) is NO_PROFILE
    s = feed(empty(), MON_MIN, [1_000_000] * 90)
    assert evaluate(s, RollingThresholds()) is NO_PROFILE


@pytest.mark.parametrize("bad", [
    {"spans": ()}, {"spans": (0, 5)}, {"spans": (5, 2000)}, {"weeks": 2, "min_weeks": 3},
    {"min_weeks": 0}, {"clip_sigmas": 0.0},
])
def test_bad_policies_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RollingPolicy(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [
    {"k": 0.0}, {"skew": -1.0}, {"multiple": 0.9}, {"floor_micros": -1}, {"cv_floor": -0.1},
])
def test_bad_thresholds_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RollingThresholds(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("span_min", "k"), [(1, 7.5), (4, 6.0), (25, 5.1), (100, 4.8)])
def test_short_spans_need_a_higher_score(span_min: int, k: float) -> None:
    assert RollingThresholds(k=4.5, skew=3.0).k_for(span_min) == pytest.approx(k)
