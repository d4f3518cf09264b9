"""Tumbling event-time windows and their place in the week. Pure integer arithmetic.

A window is identified by its start (epoch ms, UTC) and is ``[start, start + size)``; the
size divides a day, so windows align to midnight UTC and every window has one hour-of-day
(0-23) and one day-of-week (0 = Monday ... 6 = Sunday, as ``datetime.weekday()``).

The *week slot* of a window is its position in the UTC week (Monday 00:00 is slot 0). Two
windows with the same slot are "the same time last week": with the default one-hour size
the slot is ``day_of_week * 24 + hour_of_day``, the (dow, hour) seasonal bucket. Event time
(``occurred_at``) decides the window, never the wall clock.
"""

from __future__ import annotations

__all__ = [
    "AHEAD_COUNTED_MS",
    "DAY_MS",
    "DEFAULT_WINDOW_MS",
    "HOUR_MS",
    "WEEK_MS",
    "check_window_ms",
    "counted_at",
    "day_of_week",
    "hour_of_day",
    "slots_per_week",
    "week_slot",
    "window_end",
    "window_start",
    "windows_between",
]

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
WEEK_MS = 7 * DAY_MS
DEFAULT_WINDOW_MS = HOUR_MS
_EPOCH_DOW = 3  # 1970-01-01 was a Thursday (Monday = 0)


def check_window_ms(window_ms: int) -> int:
    """Return ``window_ms`` if it is a positive divisor of a day, else raise ValueError."""
    if window_ms <= 0 or DAY_MS % window_ms:
        raise ValueError(f"window size must be a positive divisor of a day (ms): {window_ms}")
    return window_ms


def window_start(ts_ms: int, window_ms: int = DEFAULT_WINDOW_MS) -> int:
    """Start of the window holding ``ts_ms`` (floor; correct before 1970 too)."""
    return ts_ms - ts_ms % window_ms


def window_end(start_ms: int, window_ms: int = DEFAULT_WINDOW_MS) -> int:
    """Exclusive end of the window starting at ``start_ms``."""
    return start_ms + window_ms


def windows_between(first_start_ms: int, later_start_ms: int,
                    window_ms: int = DEFAULT_WINDOW_MS) -> int:
    """How many windows lie in ``[first_start, later_start)`` (0 when not later)."""
    return max(0, (later_start_ms - first_start_ms) // window_ms)


def hour_of_day(ts_ms: int) -> int:
    """UTC hour of day, 0-23."""
    return (ts_ms // HOUR_MS) % 24


def day_of_week(ts_ms: int) -> int:
    """UTC day of week, 0 = Monday ... 6 = Sunday."""
    return (ts_ms // DAY_MS + _EPOCH_DOW) % 7


def slots_per_week(window_ms: int = DEFAULT_WINDOW_MS) -> int:
    """Number of windows in a week (168 for one-hour windows)."""
    return WEEK_MS // window_ms


def week_slot(start_ms: int, window_ms: int = DEFAULT_WINDOW_MS) -> int:
    """Position of the window in the UTC week: Monday 00:00 is 0."""
    return ((start_ms + _EPOCH_DOW * DAY_MS) % WEEK_MS) // window_ms


# How far ahead of the time its delivery was written (the Kafka record's timestamp) an
# event may be counted: the minute it names, up to this; past it, the minute it was written.
AHEAD_COUNTED_MS = 60_000


def counted_at(occurred_at_ms: int, written_ms: int, now_ms: int) -> int:
    """The event time a delivery is counted and judged at: its ``occurred_at``, but never
    more than :data:`AHEAD_COUNTED_MS` after the time its record was written (or the
    reader's clock, if that is earlier). One delivery dated an hour ahead used to move its
    endpoint's and partition's windows an hour into the future: every later delivery was
    counted into that minute, blinding the scope, then tripping it on normal traffic. The
    record's timestamp makes it the same minute when the record is read again."""
    return min(occurred_at_ms, min(written_ms or now_ms, now_ms) + AHEAD_COUNTED_MS)
