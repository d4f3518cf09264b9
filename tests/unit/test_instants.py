"""parse_instant: epoch ms or ISO-8601 with an offset; anything else names the field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from postbacks.core.instants import MAX_MS, InstantError, parse_instant

NOON = int(datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)  # 1772366400000


@pytest.mark.parametrize(("value", "ms"), [
    (NOON, NOON),
    (0, 0),
    (MAX_MS, MAX_MS),
    (str(NOON), NOON),
    (f"  {NOON}\n", NOON),
    ("0", 0),
    ("2026-03-01T12:00:00Z", NOON),
    ("2026-03-01T12:00:00z", NOON),
    ("2026-03-01T12:00:00+00:00", NOON),
    ("2026-03-01T14:00:00+02:00", NOON),
    ("2026-03-01T07:30:00-04:30", NOON),
    ("2026-03-01 12:00:00Z", NOON),
    ("2026-03-01T12:00Z", NOON),
    ("2026-03-01T12:00:00.250Z", NOON + 250),
    ("2026-03-01T12:00:00.250999+00:00", NOON + 250),  # sub-ms floored
    ("2026-03-01T12:00:00.001Z", NOON + 1),
    ("20260301T120000Z", NOON),  # basic format
    ("1970-01-01T00:00:00Z", 0),
    ("1970-01-01T01:00:00+01:00", 0),
    ("9999-12-31T23:59:59.999Z", MAX_MS),
])
def test_accepted(value: object, ms: int) -> None:
    assert parse_instant(value, "occurred_at") == ms


@pytest.mark.parametrize(("value", "why"), [
    ("2026-03-01T12:00:00", "without an offset"),
    ("2026-03-01 12:00", "without an offset"),
    ("2026-03-01", "without an offset"),
    ("yesterday", "not epoch milliseconds nor ISO-8601"),
    ("12:00:00Z", "not epoch milliseconds nor ISO-8601"),
    ("2026-13-01T12:00:00Z", "not epoch milliseconds nor ISO-8601"),
    ("2026-03-01T12:00:00+25:00", "not epoch milliseconds nor ISO-8601"),
    ("-1772366400000", "not epoch milliseconds nor ISO-8601"),
    ("1.7e12", "not epoch milliseconds nor ISO-8601"),
    ("", "empty"),
    ("   ", "empty"),
    ("1" * 65, "too long"),
    ("\u0661\u0662\u0663", "not epoch milliseconds nor ISO-8601"),  # non-ASCII digits
    (True, "boolean"),
    (False, "boolean"),
    (float("nan"), "float"),
    (float("inf"), "float"),
    (1_772_366_400_000.0, "float"),
    (None, "missing"),
    (b"1772366400000", "unsupported type bytes"),
    ([NOON], "unsupported type list"),
    (-1, "out of range"),
    (MAX_MS + 1, "out of range"),
    (str(MAX_MS + 1), "out of range"),
    ("1969-12-31T23:59:59Z", "out of range"),
    ("0001-01-01T00:00:00+01:00", "out of range"),
    ("9999-12-31T23:59:59-01:00", "out of range"),
])
def test_rejected_naming_the_field(value: object, why: str) -> None:
    with pytest.raises(InstantError) as err:
        parse_instant(value, "source_completed_at")
    assert str(err.value).startswith("source_completed_at: ")
    assert why in str(err.value)
    assert err.value.field == "source_completed_at"
    assert isinstance(err.value, ValueError)


def test_long_values_are_shortened_in_the_message() -> None:
    with pytest.raises(InstantError) as err:
        parse_instant("x" * 60, "f")
    assert len(str(err.value)) < 200
