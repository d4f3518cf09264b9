"""An endpoint's health from its attempts, and when it is disabled (parameter tables)."""

from __future__ import annotations

import pytest

from postbacks.core.endpoint_health import (
    BatchHealth,
    Health,
    disable_reason,
    fold_attempts,
    merge,
)

H = 3_600_000
T = 1_800_000_000_000


@pytest.mark.parametrize(("attempts", "want"), [
    # failures only: failing since the first
    ([("e", T + 5, "retryable", 503), ("e", T + 1, "permanent", 404)],
     {"e": BatchHealth(None, T + 1, None)}),
    # a success resets: only the failures after it count
    ([("e", T + 1, "retryable", 503), ("e", T + 2, "delivered", 200),
      ("e", T + 3, "validation_failed", 200)], {"e": BatchHealth(T + 2, T + 3, None)}),
    ([("e", T + 1, "retryable", 503), ("e", T + 2, "delivered", 200)],
     {"e": BatchHealth(T + 2, None, None)}),
    # the platform's own failures say nothing of the endpoint
    ([("e", T, "render_failed", None), ("e", T, "blocked_address", None)], {}),
    # 410 Gone noted
    ([("e", T + 7, "permanent", 410)], {"e": BatchHealth(None, T + 7, T + 7)}),
    # endpoints apart
    ([("a", T, "delivered", 200), ("b", T, "retryable", None)],
     {"a": BatchHealth(T, None, None), "b": BatchHealth(None, T, None)}),
])
def test_fold_attempts(attempts: list[tuple[str, int, str, int | None]],
                       want: dict[str, BatchHealth]) -> None:
    assert fold_attempts(attempts) == want


MERGE_CASES = [
    (None, BatchHealth(None, T, None), Health(None, T, None)),
    # still failing: the first failure stays
    (Health(None, T, None), BatchHealth(None, T + H, None), Health(None, T, None)),
    # a newer success: its failures after it, or none
    (Health(T - H, T, None), BatchHealth(T + H, None, None), Health(T + H, None, None)),
    (Health(T - H, T, None), BatchHealth(T + H, T + 2 * H, None),
     Health(T + H, T + 2 * H, None)),
    # a success older than the stored one (read late) changes nothing of failing_since
    (Health(T + H, T + 2 * H, None), BatchHealth(T, None, None), Health(T + H, T + 2 * H, None)),
    # failing since the batch, after a success stored long ago
    (Health(T - H, None, None), BatchHealth(None, T, T), Health(T - H, T, T)),
]


@pytest.mark.parametrize(("stored", "batch", "want"), MERGE_CASES)
def test_merge(stored: Health | None, batch: BatchHealth, want: Health) -> None:
    assert merge(stored, batch) == want


@pytest.mark.parametrize(("health", "now", "gone_rule", "disabled"), [
    (Health(None, T, None), T + 72 * H, False, True),          # 72 h of failures
    (Health(None, T, None), T + 72 * H - 1, False, False),     # not yet
    (Health(T - H, None, None), T + 100 * H, False, False),    # succeeding
    (Health(None, T, T), T + 1, True, True),                   # 410 under disable_on_gone
    (Health(None, T, T), T + 1, False, False),                 # ... only under it
    (Health(T + 5, None, T), T + H, True, False),              # a success after the 410
])
def test_disable_reason(health: Health, now: int, gone_rule: bool, disabled: bool) -> None:
    why = disable_reason(health, now_ms=now, after_s=72 * 3600, disable_on_gone=gone_rule)
    assert (why is not None) == disabled
    if disabled:
        assert ("410" in why) == (gone_rule and health.last_gone_ms is not None)  # type: ignore[operator]
