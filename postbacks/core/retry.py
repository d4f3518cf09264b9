"""The retry schedule as data, and the decision for a failed attempt.

Exponential from ``base_s`` doubling per attempt, capped at ``max_delay_s`` between
attempts, jittered upward only (a retry is never earlier than scheduled, and retries of a
burst never fire in one synchronized wave), stopping at a ceiling measured from the first
attempt or at the event type's max attempts. ``Retry-After`` raises the delay (capped).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from topics.registry import RETRY_TIERS

__all__ = ["DeadLetter", "RetryPolicy", "ScheduleRetry", "next_step"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_s: float = 5.0
    max_delay_s: float = 6 * 3600.0
    ceiling_s: float = 24 * 3600.0
    jitter: float = 0.2
    max_attempts: int = 50
    max_attempts_by_event_type: Mapping[str, int] = field(default_factory=dict)

    def delay_s(self, attempt_no: int) -> float:
        """Delay after failed attempt ``attempt_no`` (1-based), before jitter. The doubling
        stops at 2**62 (past that ``2.0 ** n`` overflows a float, from attempt 1,025: an
        endpoint's high ``max_attempts`` with a short ``max_delay_s`` reaches it)."""
        return min(self.base_s * 2.0 ** min(attempt_no - 1, 62), self.max_delay_s)


@dataclass(frozen=True, slots=True)
class ScheduleRetry:
    tier: str
    due_at_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str


def tier_for(delay_s: float) -> str:
    """The longest tier not longer than the delay (the relay holds until due_at anyway)."""
    chosen = RETRY_TIERS[0][0]
    for name, seconds in RETRY_TIERS:
        if seconds <= delay_s:
            chosen = name
    return chosen


def next_step(
    policy: RetryPolicy, *, attempt_no: int, event_type: str, first_attempt_ms: int,
    now_ms: int, retry_after_s: float | None, rand: float,
) -> ScheduleRetry | DeadLetter:
    """After failed attempt ``attempt_no``: retry when, or give up. ``rand`` in [0, 1).

    A record from another producer may carry any numbers: an attempt below 1 (no backoff:
    it retried in a tight loop, never reaching the limit) counts as the first, and a first
    attempt in the future (the ceiling never reached) as now."""
    attempt_no = max(attempt_no, 1)
    first_attempt_ms = min(first_attempt_ms, now_ms)
    limit = policy.max_attempts_by_event_type.get(event_type, policy.max_attempts)
    if attempt_no >= limit:
        return DeadLetter("exhausted")
    delay = policy.delay_s(attempt_no) * (1.0 + policy.jitter * rand)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    due = now_ms + int(delay * 1000)
    if due - first_attempt_ms > policy.ceiling_s * 1000:
        return DeadLetter("exhausted")
    return ScheduleRetry(tier_for(delay), due)
