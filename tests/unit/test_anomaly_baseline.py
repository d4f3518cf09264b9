"""Seasonal baseline: history per (day-of-week, hour) slot, closing, median, serialization."""

from __future__ import annotations

import pytest

from postbacks.core.anomaly.baseline import (
    BaselinePolicy,
    SeasonalBaseline,
    add,
    baseline,
    close_until,
    empty,
    from_dict,
    median,
    to_dict,
)
from postbacks.core.anomaly.windows import DAY_MS, HOUR_MS, WEEK_MS, week_slot

MON = 1_772_409_600_000  # 2026-03-02T00:00:00Z, a Monday
MON9 = MON + 9 * HOUR_MS
USD = 1_000_000


def weeks_of(totals: list[int], at: int = MON9, policy: BaselinePolicy | None = None,
             ) -> SeasonalBaseline:
    """One payout per week at ``at`` (+ k weeks), then the state at ``at`` + len weeks."""
    s = empty(policy or BaselinePolicy())
    for k, t in enumerate(totals):
        s = add(s, at + k * WEEK_MS, t)
    return close_until(s, at + len(totals) * WEEK_MS)


@pytest.mark.parametrize(("samples", "expected"), [
    ((5,), 5.0), ((1, 9), 5.0), ((9, 1, 5), 5.0), ((1, 2, 3, 100), 2.5), ((0, 0, 0, 0), 0.0),
])
def test_median(samples: tuple[int, ...], expected: float) -> None:
    assert median(samples) == expected


@pytest.mark.parametrize(("totals", "min_weeks", "expected"), [
    ([], 2, None),
    ([100], 2, None),                     # one week of history is not enough
    ([100, 300], 2, 200.0),
    ([100, 300, 200], 2, 200.0),
    ([100, 300, 200, 10_000], 2, 250.0),  # median: one bad week barely moves it
    ([1, 2, 3, 4, 5, 6], 2, 4.5),         # only the last 4 weeks are kept
    ([100, 300], 3, None),
    ([100], 1, 100.0),
])
def test_baseline_needs_min_weeks(totals: list[int], min_weeks: int,
                                  expected: float | None) -> None:
    s = weeks_of(totals, policy=BaselinePolicy(min_weeks=min_weeks))
    assert baseline(s, MON9 + len(totals) * WEEK_MS) == expected
    assert s.open_baseline == expected or not totals


def test_seasonality_monday_9_compares_with_past_mondays_9() -> None:
    s = empty()
    for week in range(3):
        for day in range(7):
            for hour in range(24):
                ts = MON + week * WEEK_MS + day * DAY_MS + hour * HOUR_MS
                busy = day == 0 and hour == 9
                s = add(s, ts + 1, 1_000 * USD if busy else 10 * USD)
    s = close_until(s, MON + 3 * WEEK_MS)
    assert baseline(s, MON9 + 3 * WEEK_MS) == 1_000 * USD       # Monday 09:00
    assert baseline(s, MON9 + 3 * WEEK_MS + HOUR_MS) == 10 * USD  # Monday 10:00
    assert baseline(s, MON9 + 3 * WEEK_MS + DAY_MS) == 10 * USD   # Tuesday 09:00


def test_empty_windows_count_as_zero() -> None:
    s = add(empty(), MON9, 50 * USD)
    s = close_until(s, MON9 + 2 * WEEK_MS + 1)  # two quiet weeks after one busy hour
    assert baseline(s, MON9 + 2 * WEEK_MS) == 25.0 * USD  # median of (50, 0)
    assert baseline(s, MON9 + 2 * WEEK_MS + HOUR_MS) == 0.0



def test_history_starts_at_the_first_event() -> None:
    s = close_until(add(empty(), MON9, 5), MON9 + 3 * HOUR_MS)
    assert [len(h) for h in s.history[8:13]] == [0, 1, 1, 1, 0]


def test_a_gap_longer_than_the_history_is_all_zeros() -> None:
    s = add(empty(), MON9, 50 * USD)
    s = add(s, MON9 + 10 * WEEK_MS, 7)
    assert all(h == (0, 0, 0, 0) for h in s.history)
    assert s.open_total == 7 and s.open_baseline == 0.0


@pytest.mark.parametrize(("events", "open_start", "open_total"), [
    ([(MON9, 5)], MON9, 5),
    ([(MON9, 5), (MON9 + HOUR_MS - 1, 7)], MON9, 12),
    ([(MON9, 5), (MON9 + HOUR_MS, 7)], MON9 + HOUR_MS, 7),
    ([(MON9 + HOUR_MS, 7), (MON9, 5)], MON9 + HOUR_MS, 12),  # late: counts in the open window
])
def test_add_keeps_the_open_window(events: list[tuple[int, int]], open_start: int,
                                   open_total: int) -> None:
    s = empty()
    for ts, p in events:
        s = add(s, ts, p)
    assert (s.open_start, s.open_total) == (open_start, open_total)


@pytest.mark.parametrize(("now", "closed"), [
    (MON9 + HOUR_MS - 1, False),  # the window has not ended
    (MON9 + HOUR_MS, True),       # end <= now closes it
    (MON9 + 5 * HOUR_MS, True),
    (MON9 - WEEK_MS, False),      # a clock behind the open window changes nothing
])
def test_close_until(now: int, closed: bool) -> None:
    s = add(empty(), MON9, 5)
    after = close_until(s, now)
    slot = week_slot(MON9)
    assert (after.history[slot] == (5,)) is closed
    assert (after is s) is not closed
    if closed:
        assert after.open_start == now - now % HOUR_MS and after.open_total == 0


def test_close_until_on_a_fresh_scope_is_a_no_op() -> None:
    s = empty()
    assert close_until(s, MON9) is s


def test_state_is_immutable() -> None:
    s = empty()
    s2 = add(s, MON9, 5)
    assert s.open_total == 0 and s2.open_total == 5
    with pytest.raises(AttributeError):
        s2.open_total = 9  # type: ignore[misc]


def test_round_trip_is_ints_and_strings() -> None:
    s = weeks_of([100, 300, 200])
    s = add(s, MON9 + 3 * WEEK_MS + 10, 42)
    d = to_dict(s)
    assert all(type(v) in (int, str) for v in d.values())
    back = from_dict(d)
    assert back == s
    assert from_dict(to_dict(empty())) == empty()


def test_from_dict_retrims_to_the_current_policy() -> None:
    s = weeks_of([1, 2, 3, 4])
    back = from_dict(to_dict(s), BaselinePolicy(weeks=2, min_weeks=1))
    assert back.history[week_slot(MON9)] == (3, 4)
    assert back.open_baseline == 3.5


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(v=2),
    lambda d: d.update(history="1,2;3"),
    lambda d: d.update(history="x"),
    lambda d: d.update(history=5),
    lambda d: d.update(open_total="5"),
    lambda d: d.pop("window_ms"),
    lambda d: d.update(window_ms=7),
])
def test_from_dict_refuses_malformed(mutate: object) -> None:
    d = to_dict(add(empty(), MON9, 5))
    mutate(d)  # type: ignore[operator]
    with pytest.raises(ValueError):
        from_dict(d)


def test_from_dict_refuses_another_window_size() -> None:
    with pytest.raises(ValueError, match="window size"):
        from_dict(to_dict(empty()), BaselinePolicy(window_ms=30 * 60_000))


@pytest.mark.parametrize(("weeks", "min_weeks", "window"), [
    (4, 0, HOUR_MS), (2, 3, HOUR_MS), (4, 2, 7 * 60_000),
])
def test_policy_validation(weeks: int, min_weeks: int, window: int) -> None:
    with pytest.raises(ValueError):
        BaselinePolicy(window, weeks, min_weeks)
