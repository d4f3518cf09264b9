"""One parser for an input instant: epoch milliseconds or ISO-8601 with an offset.

Inputs arrive as JSON, CSV or Avro fields. An instant is accepted in two forms only:

- **epoch milliseconds**: an ``int`` (not a ``bool``), or a string of ASCII digits
  (surrounding whitespace ignored). Digits are always milliseconds, never a date.
- **ISO-8601 with an explicit offset**: ``2026-03-01T12:00:00Z``,
  ``2026-03-01T14:00:00.250+02:00``. Sub-millisecond digits are floored.

Everything else is an :class:`InstantError` naming the field: a naive ISO string (no
offset: its zone would be a guess), a date alone, garbage, a float (``NaN``, ``1.7e12``:
a float cannot carry milliseconds exactly), ``None``, a bool, or an instant outside
1970-01-01T00:00:00Z .. 9999-12-31T23:59:59.999Z. Pure: no clock, no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = ["MAX_FUTURE_MS", "MAX_MS", "MIN_MS", "MIN_OCCURRED_AT_MS", "InstantError",
           "parse_instant"]

MIN_MS = 0  # 1970-01-01T00:00:00Z
MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
# A conversion's ``occurred_at`` (the gate's event time): from 2000-01-01T00:00:00Z (before
# it, epoch seconds where milliseconds belong) to 1 h ahead of the reader's clock (past it,
# microseconds, or a wrong clock, that would move event-time windows into the future).
MIN_OCCURRED_AT_MS = 946_684_800_000
MAX_FUTURE_MS = 3_600_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_MAX_LEN = 64  # longer strings are garbage, not instants


class InstantError(ValueError):
    """An input instant that is neither epoch ms nor ISO-8601 with an offset."""

    def __init__(self, field: str, value: object, why: str) -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field}: {why}: {shown}")
        self.field = field
        self.value = value
        self.why = why


def _in_range(ms: int, field: str, value: object) -> int:
    if not MIN_MS <= ms <= MAX_MS:
        raise InstantError(field, value, "out of range (1970-01-01 .. 9999-12-31 UTC)")
    return ms


def _iso(text: str, field: str, value: object) -> int:
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise InstantError(field, value,
                           "not epoch milliseconds nor ISO-8601 with an offset") from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise InstantError(field, value, "ISO-8601 without an offset (add Z or +hh:mm)")
    try:
        ms = (dt - _EPOCH) // _ONE_MS
    except OverflowError:
        raise InstantError(field, value, "out of range (1970-01-01 .. 9999-12-31 UTC)") from None
    return _in_range(ms, field, value)


def parse_instant(value: object, field: str) -> int:
    """Epoch ms (UTC) of ``value``; raises :class:`InstantError` naming ``field``."""
    if type(value) is int:
        return _in_range(value, field, value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise InstantError(field, value, "empty")
        if len(text) > _MAX_LEN:
            raise InstantError(field, value, "too long to be an instant")
        if text.isascii() and text.isdigit():
            return _in_range(int(text), field, value)
        if text[-1] == "z":  # RFC 3339 allows a lower-case zone designator
            text = text[:-1] + "Z"
        return _iso(text, field, value)
    if value is None:
        raise InstantError(field, value, "missing")
    if isinstance(value, bool):
        raise InstantError(field, value, "a boolean is not an instant")
    if isinstance(value, float):
        raise InstantError(field, value, "a float is not epoch milliseconds (use an integer)")
    raise InstantError(field, value, f"unsupported type {type(value).__name__}")
