"""When a diverted delivery comes back from quarantine. Pure.

The agent diverts a delivery to ``quarantine.v1`` without using an attempt: its endpoint is
over its buffer budget, its breaker is open or probing, or the endpoint is not in the
agent's view yet. Every diverted delivery of one endpoint used to come back at the same
moment (``now + POSTBACKS_QUARANTINE_DELAY_S``, or exactly when the breaker reopens): after
a long outage, a backlog of millions went dispatch -> agent -> quarantine -> relay ->
dispatch once a cycle on that endpoint's partition, and every other endpoint on the
partition waited behind the churn. So:

* over budget, the wait doubles each time the delivery is diverted again in a row (the
  count is kept in its ``last_error``, ``quarantined (3): over_budget``), up to
  :data:`MAX_DOUBLINGS` doublings, and gets up to :data:`JITTER` more at random;
* behind an open breaker, the returns are spread over the breaker's ramp after it reopens
  (the ramp is when the endpoint takes more again), not all at the reopening;
* a delivery whose endpoint the agent has not seen yet (:data:`UNSEEN`) comes back when
  asked, unspread: the endpoint may order its deliveries strictly, which the agent cannot
  know yet, and deliveries diverted one after the other must come back in that order;
* any other wait gets up to :data:`JITTER` more at random.
"""

from __future__ import annotations

import re

__all__ = ["JITTER", "MAX_DOUBLINGS", "UNSEEN", "quarantine_due", "quarantine_note",
           "times_quarantined"]

JITTER = 0.2  # a wait gets up to this fraction more, at random
MAX_DOUBLINGS = 4  # over budget: 30 s, 60 s, 120 s, 240 s, then 480 s each time
UNSEEN = "endpoint_unseen"  # the reason of a delivery whose endpoint is not in the view yet

_MARK = re.compile(r"^quarantined(?: \((\d+)\))?:")


def times_quarantined(last_error: str | None) -> int:
    """How many times in a row the delivery has been diverted (0: it was not)."""
    m = _MARK.match(last_error or "")
    if m is None:
        return 0
    return int(m.group(1)) if m.group(1) else 1


def quarantine_note(reason: str, times: int) -> str:
    """The ``last_error`` of a delivery diverted for the ``times``-th time in a row."""
    return f"quarantined: {reason}" if times <= 1 else f"quarantined ({times}): {reason}"


def quarantine_due(reason: str, due_at_ms: int, now_ms: int, *, times: int, ramp_s: float,
                   rand: float) -> int:
    """When a delivery diverted for ``reason`` (the ``times``-th time in a row, counting this
    one) comes back, given the time the divert asked for (``due_at_ms``) and a uniform
    ``rand`` in [0, 1)."""
    wait_ms = max(0, due_at_ms - now_ms)
    if reason == "over_budget":
        wait_ms *= 2 ** min(max(0, times - 1), MAX_DOUBLINGS)
        return now_ms + int(wait_ms * (1 + JITTER * rand))
    if reason == "breaker_open":
        return due_at_ms + int(rand * ramp_s * 1000)
    if reason == UNSEEN:
        return due_at_ms
    return now_ms + int(wait_ms * (1 + JITTER * rand))
