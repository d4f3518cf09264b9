"""The delay-topic decision: may this record go back to dispatch now? Pure."""

from __future__ import annotations

__all__ = ["is_due", "wait_s"]


def is_due(due_at_ms: int | None, now_ms: int) -> bool:
    """A record without ``due_at`` is due at once; never release one early."""
    return due_at_ms is None or due_at_ms <= now_ms


def wait_s(dues_ms: list[int], now_ms: int, *, poll_s: float = 0.5) -> float:
    """How long the relay may block in poll: until the earliest paused head is due."""
    if not dues_ms:
        return poll_s
    return max(0.0, min(poll_s, (min(dues_ms) - now_ms) / 1000))
