"""When a diverted delivery comes back: paced at the endpoint's own pace, in order."""

from __future__ import annotations

import pytest

from postbacks.core.quarantine import (
    DEFAULT_SLOT_S,
    PACE_MAX_MS,
    paced_due,
    quarantine_note,
    slot_ms,
    times_quarantined,
)

NOW = 1_700_000_000_000


@pytest.mark.parametrize(("last_error", "times"), [
    (None, 0), ("", 0), ("http_503", 0), ("timeout", 0),
    ("quarantined: over_budget", 1), ("quarantined (2): breaker_open", 2),
    ("quarantined (17): over_budget", 17), ("not quarantined: x", 0),
    ("waiting: strict order behind dlv_1", 0),
])
def test_the_count_of_diverts_in_a_row_is_read_back(last_error: str | None, times: int) -> None:
    assert times_quarantined(last_error) == times


def test_the_note_round_trips() -> None:
    for n in (1, 2, 9):
        assert times_quarantined(quarantine_note("over_budget", n)) == n
    assert quarantine_note("breaker_open", 1) == "quarantined: breaker_open"


def test_a_slot_is_the_time_per_delivery_at_the_endpoints_pace() -> None:
    assert slot_ms(0.2, 4) == 50  # 200 ms answers, 4 at a time
    assert slot_ms(0.0, 4) == int(DEFAULT_SLOT_S * 1000 / 4)  # none timed yet
    assert slot_ms(0.0001, 100) == 1 and slot_ms(10, 0) == 10_000


def test_a_backlog_comes_back_at_the_pace_the_endpoint_drains_it_in_order() -> None:
    """3,000 diverted at once from an endpoint doing 10 a second: they come back from the
    quarantine delay on, one every 100 ms, in the order they left -- not all at once."""
    until, dues = 0, []
    for _ in range(3000):
        due, until = paced_due(NOW + 30_000, until, NOW, slot_ms(0.4, 4))
        dues.append(due)
    assert dues[0] == NOW + 30_000 and dues == sorted(dues)
    assert dues[-1] == NOW + 30_000 + 2999 * 100
    # a later divert, once those are due: at its own quarantine delay again
    later = NOW + 400_000
    assert paced_due(later + 30_000, until, later, 100)[0] == later + 30_000


def test_behind_an_open_breaker_the_first_is_the_probe_at_the_reopening() -> None:
    reopen = NOW + 300_000
    first, until = paced_due(reopen, 0, NOW, 2_500)
    second, _ = paced_due(reopen, until, NOW, 2_500)
    assert (first, second) == (reopen, reopen + 2_500)


def test_pacing_never_reaches_further_than_the_cap() -> None:
    until = NOW + 10 * PACE_MAX_MS  # a backlog paced far ahead
    due, _ = paced_due(NOW + 30_000, until, NOW, 100)
    assert due == NOW + PACE_MAX_MS


def test_a_divert_due_within_a_minute_waits_in_quarantine_a_later_one_in_a_retry_tier() -> None:
    from postbacks.core.quarantine import QUARANTINE_AHEAD_MS, divert_topic

    now = 1_700_000_000_000
    assert QUARANTINE_AHEAD_MS == 60_000
    for ahead_s, topic in [(0, "quarantine.v1"), (30, "quarantine.v1"), (60, "quarantine.v1"),
                           (61, "retry.30s.v1"), (300, "retry.2m.v1"), (599, "retry.2m.v1"),
                           (3_600, "retry.1h.v1"), (7 * 3_600, "retry.6h.v1")]:
        assert divert_topic(now + ahead_s * 1000, now) == topic, ahead_s
