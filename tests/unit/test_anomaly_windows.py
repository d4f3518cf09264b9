"""Window math: assignment, bounds, hour-of-day, day-of-week and week slot (UTC)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from postbacks.core.anomaly.windows import (
    DAY_MS,
    HOUR_MS,
    WEEK_MS,
    check_window_ms,
    day_of_week,
    hour_of_day,
    slots_per_week,
    week_slot,
    window_end,
    window_start,
    windows_between,
)

MON = 1_772_409_600_000  # 2026-03-02T00:00:00Z, a Monday
MIN = 60_000


def _ms(when: tuple[int, int, int, int, int]) -> int:
    y, mo, d, h, mi = when
    return int(datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(("ts", "size", "start"), [
    (MON, HOUR_MS, MON),
    (MON + 1, HOUR_MS, MON),
    (MON + HOUR_MS - 1, HOUR_MS, MON),
    (MON + HOUR_MS, HOUR_MS, MON + HOUR_MS),
    (MON + 9 * HOUR_MS + 59 * MIN, HOUR_MS, MON + 9 * HOUR_MS),
    (MON + 14 * MIN, 15 * MIN, MON),
    (MON + 15 * MIN, 15 * MIN, MON + 15 * MIN),
    (MON + 23 * HOUR_MS, DAY_MS, MON),
    (0, HOUR_MS, 0),
    (-1, HOUR_MS, -HOUR_MS),  # floor, not truncation, before 1970
])
def test_window_assignment(ts: int, size: int, start: int) -> None:
    assert window_start(ts, size) == start
    assert window_start(ts, size) <= ts < window_end(window_start(ts, size), size)


@pytest.mark.parametrize(("when", "dow", "hour"), [
    ((2026, 3, 2, 0, 0), 0, 0),      # Monday midnight
    ((2026, 3, 2, 9, 30), 0, 9),
    ((2026, 3, 8, 23, 59), 6, 23),   # Sunday
    ((2026, 3, 9, 0, 0), 0, 0),
    ((1970, 1, 1, 0, 0), 3, 0),      # the epoch was a Thursday
    ((2024, 2, 29, 12, 0), 3, 12),   # leap day
    ((1969, 12, 31, 23, 0), 2, 23),  # before the epoch
])
def test_dow_and_hour_are_utc(when: tuple[int, int, int, int, int], dow: int,
                              hour: int) -> None:
    ts = _ms(when)
    assert day_of_week(ts) == dow == datetime.fromtimestamp(ts / 1000, UTC).weekday()
    assert hour_of_day(ts) == hour


@pytest.mark.parametrize(("ts", "size", "slot"), [
    (MON, HOUR_MS, 0),
    (MON + 9 * HOUR_MS, HOUR_MS, 9),
    (MON + DAY_MS + 9 * HOUR_MS, HOUR_MS, 33),        # Tuesday 09:00 = 1 * 24 + 9
    (MON + 6 * DAY_MS + 23 * HOUR_MS, HOUR_MS, 167),  # Sunday 23:00
    (MON + WEEK_MS + 9 * HOUR_MS, HOUR_MS, 9),        # a week later: the same slot
    (MON - 4 * WEEK_MS + 9 * HOUR_MS, HOUR_MS, 9),
    (MON + 9 * HOUR_MS + 15 * MIN, 15 * MIN, 37),
])
def test_week_slot(ts: int, size: int, slot: int) -> None:
    assert week_slot(ts, size) == slot
    if size == HOUR_MS:
        assert slot == day_of_week(ts) * 24 + hour_of_day(ts)


@pytest.mark.parametrize(("size", "ok"), [
    (HOUR_MS, True), (15 * MIN, True), (DAY_MS, True), (MIN, True),
    (0, False), (-HOUR_MS, False), (7 * MIN, False), (2 * DAY_MS, False),
])
def test_window_size_must_divide_a_day(size: int, ok: bool) -> None:
    if ok:
        assert check_window_ms(size) == size
        assert slots_per_week(size) * size == WEEK_MS
    else:
        with pytest.raises(ValueError, match="divisor of a day"):
            check_window_ms(size)


@pytest.mark.parametrize(("a", "b", "n"), [
    (MON, MON, 0), (MON, MON + HOUR_MS, 1), (MON, MON + WEEK_MS, 168), (MON + HOUR_MS, MON, 0),
])
def test_windows_between(a: int, b: int, n: int) -> None:
    assert windows_between(a, b) == n
