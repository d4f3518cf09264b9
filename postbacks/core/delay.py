"""The delay-topic decision: may this record go back to dispatch now? Pure."""

from __future__ import annotations

__all__ = ["MAX_AHEAD_MS", "due_too_far", "is_due", "ripe_at", "wait_s"]

# The furthest ahead any configuration schedules a delivery on a delay topic (the retry
# ceiling is at most 72 h), plus an hour for a clock that is ahead of the relay's.
MAX_AHEAD_MS = 73 * 3_600_000


def is_due(due_at_ms: int | None, now_ms: int) -> bool:
    """A record without ``due_at`` is due at once; never release one early."""
    return due_at_ms is None or due_at_ms <= now_ms


def ripe_at(due_at_ms: int | None, enqueued_at_ms: int | None,
            period_ms: int | None, now_ms: int | None = None) -> int | None:
    """When the relay takes a record off its partition's head: its ``due_at``; in a delay
    topic with a period (``period_ms``: a retry tier's, or the most a quarantine wait can
    be), one period after it was enqueued if that is sooner, so a topic's records leave in
    the order they came (None: at once).

    ``now_ms``, the reader's clock, stands in for an ``enqueued_at`` that is missing or
    ahead of it (another producer, a clock ahead): such a record still ripens within one
    period, and one ``due_at`` far ahead cannot hold the partition behind it until then."""
    if due_at_ms is None or period_ms is None:
        return due_at_ms
    if now_ms is not None and (enqueued_at_ms is None or enqueued_at_ms > now_ms):
        enqueued_at_ms = now_ms
    if enqueued_at_ms is None:
        return due_at_ms
    return min(due_at_ms, enqueued_at_ms + period_ms)


def due_too_far(due_at_ms: int | None, now_ms: int) -> str | None:
    """Why ``due_at_ms`` cannot be a delay topic's (held at a partition's head, it would
    stop every delivery behind it until then), or None when it can."""
    if due_at_ms is None or due_at_ms <= now_ms + MAX_AHEAD_MS:
        return None
    return (f"due_at {due_at_ms} is {(due_at_ms - now_ms) / 3_600_000:,.0f} h ahead of the "
            f"relay's clock ({now_ms}); no delivery is scheduled more than "
            f"{MAX_AHEAD_MS // 3_600_000} h ahead (a wrong clock, or another producer)")


def wait_s(dues_ms: list[int], now_ms: int, *, poll_s: float = 0.5) -> float:
    """How long the relay may block in poll: until the earliest paused head is due."""
    if not dues_ms:
        return poll_s
    return max(0.0, min(poll_s, (min(dues_ms) - now_ms) / 1000))
