"""When a diverted delivery comes back: spread, and backed off when diverted again."""

from __future__ import annotations

import pytest

from postbacks.core.quarantine import (
    JITTER,
    MAX_DOUBLINGS,
    UNSEEN,
    quarantine_due,
    quarantine_note,
    times_quarantined,
)

NOW = 1_700_000_000_000


@pytest.mark.parametrize(("last_error", "times"), [
    (None, 0), ("", 0), ("http_503", 0), ("timeout", 0),
    ("quarantined: over_budget", 1), ("quarantined (2): breaker_open", 2),
    ("quarantined (17): over_budget", 17), ("not quarantined: x", 0),
])
def test_the_count_of_diverts_in_a_row_is_read_back(last_error: str | None, times: int) -> None:
    assert times_quarantined(last_error) == times


def test_the_note_round_trips() -> None:
    for n in (1, 2, 9):
        assert times_quarantined(quarantine_note("over_budget", n)) == n
    assert quarantine_note("breaker_open", 1) == "quarantined: breaker_open"


def test_over_budget_doubles_in_a_row_up_to_the_limit() -> None:
    asked = NOW + 30_000
    waits = [quarantine_due("over_budget", asked, NOW, times=t, ramp_s=300, rand=0.0) - NOW
             for t in range(1, MAX_DOUBLINGS + 4)]
    assert waits[:5] == [30_000, 60_000, 120_000, 240_000, 480_000]
    assert waits[5:] == [480_000] * (len(waits) - 5)


def test_jitter_only_adds_and_spreads() -> None:
    asked = NOW + 30_000
    dues = {quarantine_due("over_budget", asked, NOW, times=1, ramp_s=300, rand=r / 10)
            for r in range(10)}
    assert len(dues) == 10 and min(dues) == asked
    assert max(dues) <= NOW + int(30_000 * (1 + JITTER))
    probing = quarantine_due("breaker_probing", NOW + 5_000, NOW, times=3, ramp_s=300,
                             rand=0.99)
    assert NOW + 5_000 <= probing <= NOW + int(5_000 * (1 + JITTER))


def test_an_open_breakers_returns_are_spread_over_its_ramp() -> None:
    reopen = NOW + 300_000
    dues = [quarantine_due("breaker_open", reopen, NOW, times=1, ramp_s=300, rand=r / 100)
            for r in range(100)]
    assert min(dues) == reopen and max(dues) < reopen + 300_000
    assert len(set(dues)) == 100  # not one wave at the reopening


def test_an_unseen_endpoints_deliveries_come_back_in_the_order_they_left() -> None:
    """Its endpoint may order deliveries strictly (the agent cannot know yet): unspread."""
    dues = [quarantine_due(UNSEEN, NOW + i + 2_000, NOW + i, times=1, ramp_s=300,
                           rand=(7 * i % 10) / 10) for i in range(10)]
    assert dues == sorted(dues) == [NOW + i + 2_000 for i in range(10)]
