from __future__ import annotations

import pytest

from postbacks.core.delay import MAX_AHEAD_MS, due_too_far, is_due, wait_s

NOW = 1_800_000_000_000


@pytest.mark.parametrize(("due", "now", "expected"),
                         [(None, 5, True), (5, 5, True), (4, 5, True), (6, 5, False)])
def test_never_early(due: int | None, now: int, expected: bool) -> None:
    assert is_due(due, now) is expected


@pytest.mark.parametrize(("dues", "now", "expected"),
                         [([], 0, 0.5), ([10_000], 0, 0.5), ([100], 0, 0.1), ([300, 50], 0, 0.05),
                          ([0], 10, 0.0)])
def test_poll_waits_no_longer_than_the_earliest_paused_head(
    dues: list[int], now: int, expected: float
) -> None:
    assert wait_s(dues, now) == pytest.approx(expected)


@pytest.mark.parametrize(("due", "far"), [
    (None, False),
    (NOW - 1, False),
    (NOW + 72 * 3_600_000, False),  # the longest retry ceiling a configuration allows
    (NOW + MAX_AHEAD_MS, False),
    (NOW + MAX_AHEAD_MS + 1, True),
    (2**62, True),  # a wrong clock, or another producer
])
def test_a_due_at_past_any_schedule_is_refused_with_why(due: int | None, far: bool) -> None:
    why = due_too_far(due, NOW)
    assert (why is not None) == far
    if why:
        assert why.startswith(f"due_at {due} is ") and "73 h ahead" in why


@pytest.mark.parametrize(("due", "enqueued", "period", "expected"), [
    (NOW + 5 * 3_600_000, NOW, 3_600_000, NOW + 3_600_000),  # a tier: one period, then on
    (NOW + 10_000, NOW, 3_600_000, NOW + 10_000),             # due sooner: at its due_at
    (NOW + 5 * 3_600_000, NOW, None, NOW + 5 * 3_600_000),    # quarantine: at its due_at
    (NOW + 5_000, None, 5_000, NOW + 5_000),                  # no enqueue time: its due_at
    (None, NOW, 5_000, None),                                  # no due_at: at once
])
def test_a_retry_tier_record_ripens_one_period_after_it_came(
        due: int | None, enqueued: int | None, period: int | None, expected: int | None) -> None:
    from postbacks.core.delay import ripe_at

    assert ripe_at(due, enqueued, period) == expected


@pytest.mark.parametrize(("due", "enqueued", "period", "expected"), [
    (NOW + 72 * 3_600_000, None, 5_000, NOW + 5_000),         # no enqueue time: the reader's
    (NOW + 72 * 3_600_000, NOW + 72 * 3_600_000, 5_000, NOW + 5_000),  # enqueued "ahead"
    (NOW + 72 * 3_600_000, NOW - 4_000, 5_000, NOW + 1_000),  # enqueued earlier: kept
    (NOW + 2_000, None, 5_000, NOW + 2_000),                  # due sooner: at its due_at
    (NOW + 72 * 3_600_000, None, None, NOW + 72 * 3_600_000),  # no period: at its due_at
])
def test_the_readers_clock_stands_in_for_a_missing_or_future_enqueue_time(
        due: int, enqueued: int | None, period: int | None, expected: int) -> None:
    from postbacks.core.delay import ripe_at

    assert ripe_at(due, enqueued, period, NOW) == expected
