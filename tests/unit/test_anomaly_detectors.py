"""Detectors: the retrodating rule and input parsing (the value rate: the rolling detector)."""

from __future__ import annotations

import pytest

from postbacks.core.anomaly.detectors import (
    MISSING_PAYOUT,
    RETRODATING_WINDOW_MS,
    MissingInputs,
    as_ms,
    payout_input,
    retrodated,
)
from postbacks.core.anomaly.windows import DAY_MS

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
    # epoch seconds: created "now", completed 60 days ago, both in seconds, compared as ms
    # would never exceed the window (the guard was blind to it)
    (T // 1000, (T - 60 * DAY_MS) // 1000,
     MissingInputs(("source_created_at", "source_completed_at"),
                   ("source_created_at", "source_completed_at"))),
    (T, (T - 60 * DAY_MS) // 1000,
     MissingInputs(("source_completed_at",), ("source_completed_at",))),
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
