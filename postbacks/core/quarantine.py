"""When a diverted delivery comes back from quarantine. Pure.

The agent diverts a delivery to ``quarantine.v1`` without using an attempt: its endpoint is
over its buffer budget, its breaker is open or probing, or the endpoint is not in the
agent's view yet. Every diverted delivery of one endpoint used to come back at the same
moment (``now + POSTBACKS_QUARANTINE_DELAY_S``, or exactly when the breaker reopens): after
a long outage, a backlog of millions went dispatch -> agent -> quarantine -> relay ->
dispatch once a cycle on that endpoint's partition, and every other endpoint on the
partition waited behind the churn.

So diverts over budget and behind an open breaker are **paced** (:func:`paced_due`): each
comes back one *slot* after the one diverted before it, a slot being the time the endpoint
takes per delivery at its own pace (its mean answer time over its concurrency). The first
comes back when the divert asked (the quarantine delay, or the breaker's reopening, where
it is the probe), the backlog then at the pace the endpoint drains it, in the order it
left, and never more than :data:`PACE_MAX_MS` ahead (past that, a delivery comes back then
and is paced again). A delivery diverted again in a row counts it in its ``last_error``
(``quarantined (3): over_budget``), for whoever looks at it.

**Where a divert waits** (:func:`divert_topic`). The relay releases each delay topic's
partition in order, and a record not due yet holds the ones behind it. ``quarantine.v1``
releases its records at their ``due_at``, so one endpoint's divert due in an hour (a
paced backlog, a ``Retry-After: 3600``) would hold every other endpoint's diverts on that
partition for an hour. So ``quarantine.v1`` takes only diverts due within
:data:`QUARANTINE_AHEAD_MS`; one due later waits in the retry tier that fits its wait,
where records leave one tier period after they came and hop until due. Either way it
uses no attempt, and its ``last_error`` says it was quarantined.
"""

from __future__ import annotations

import re

from postbacks.core.retry import tier_for
from topics.registry import TOPICS

__all__ = ["DEFAULT_SLOT_S", "PACE_MAX_MS", "QUARANTINE_AHEAD_MS", "QUARANTINE_PERIOD_MS",
           "UNSEEN", "divert_topic", "paced_due", "quarantine_note", "slot_ms",
           "times_quarantined"]

UNSEEN = "endpoint_unseen"  # the reason of a delivery whose endpoint is not in the view yet
PACE_MAX_MS = 3_600_000  # a paced delivery comes back at most this far ahead
DEFAULT_SLOT_S = 0.1  # the time per delivery of an endpoint with no answer timed yet
QUARANTINE_AHEAD_MS = 60_000  # quarantine.v1 takes diverts due within this
# the most a quarantine.v1 record waits before the relay takes it off its partition's head
# (its due time, or this long after it was enqueued: a minute of clock skew allowed)
QUARANTINE_PERIOD_MS = QUARANTINE_AHEAD_MS + 60_000

_MARK = re.compile(r"^quarantined(?: \((\d+)\))?:")


def times_quarantined(last_error: str | None) -> int:
    """How many times in a row the delivery has been diverted (0: it was not)."""
    m = _MARK.match(last_error or "")
    if m is None:
        return 0
    digits = m.group(1) or "1"  # (another producer's thousands of digits: int() refuses)
    return int(digits) if len(digits) <= 9 else 999_999_999


def divert_topic(due_at_ms: int, now_ms: int) -> str:
    """The delay topic (base name) a delivery diverted at ``now_ms`` until ``due_at_ms``
    waits in: ``quarantine.v1`` when due within :data:`QUARANTINE_AHEAD_MS`, else the
    longest retry tier not longer than its wait."""
    ahead_ms = due_at_ms - now_ms
    if ahead_ms <= QUARANTINE_AHEAD_MS:
        return TOPICS.quarantine.base
    return TOPICS.retry_tier(tier_for(ahead_ms / 1000)).base


def quarantine_note(reason: str, times: int) -> str:
    """The ``last_error`` of a delivery diverted for the ``times``-th time in a row."""
    return f"quarantined: {reason}" if times <= 1 else f"quarantined ({times}): {reason}"


def slot_ms(latency_s: float, concurrency: int) -> int:
    """The time the endpoint takes per delivery at its pace (``latency_s``: its mean answer
    time, 0 when none is timed yet)."""
    return max(1, int(1000 * (latency_s or DEFAULT_SLOT_S) / max(1, concurrency)))


def paced_due(earliest_ms: int, paced_until_ms: int, now_ms: int, slot: int) -> tuple[int, int]:
    """``(due, paced_until)``: when a delivery diverted now comes back -- at ``earliest_ms``
    or one slot after the one paced before it (``paced_until_ms``, where the next may go),
    whichever is later, but at most :data:`PACE_MAX_MS` ahead -- and where the next may go."""
    due = min(max(earliest_ms, paced_until_ms), max(earliest_ms, now_ms + PACE_MAX_MS))
    return due, due + slot
