"""Deadlines for many concurrent operations that share one timeout, swept in bulk.

An ``asyncio.timeout`` per request cost ~12 µs of CPU on a slow host (a timer handle
made and cancelled each time); this costs ~1 µs (docs/performance.md). Every
operation armed here gets the same timeout, so insertion order is deadline order: the
armed ones sit in an insertion-ordered dict, and a sweep every tick (only while any is
armed) cancels the tasks of those past their deadline, at most one tick late.

Use it as ``asyncio.timeout`` is used, with the same cancellation accounting::

    deadline = deadlines.arm(task)
    try:
        ...
    except asyncio.CancelledError:
        if deadlines.timed_out(deadline):
            return <the timeout result>
        raise  # the caller cancelled (too): it stays cancelled
    finally:
        deadlines.disarm(deadline)
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Deadline", "Deadlines"]

TICK_S = 0.05


class Deadline:
    """One operation's deadline: when, whose, and whether it was the one that cancelled."""

    __slots__ = ("at", "cancelling", "fired", "task")

    def __init__(self, at: float, task: asyncio.Task[Any]) -> None:
        self.at = at
        self.task = task
        self.cancelling = task.cancelling()  # cancel requests already pending at arm time
        self.fired = False


class Deadlines:
    """Deadlines ``timeout_s`` after arming, swept every ``min(50 ms, timeout_s / 10)``."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.tick_s = min(TICK_S, timeout_s / 10)
        self.live: dict[Deadline, None] = {}  # insertion order is deadline order
        self.ticker: asyncio.TimerHandle | None = None

    def arm(self, task: asyncio.Task[Any]) -> Deadline:
        loop = asyncio.get_running_loop()
        deadline = Deadline(loop.time() + self.timeout_s, task)
        self.live[deadline] = None
        if self.ticker is None:
            self.ticker = loop.call_later(self.tick_s, self._expire_due)
        return deadline

    def timed_out(self, deadline: Deadline) -> bool:
        """In ``except CancelledError``: was it this deadline's cancel, and only its?"""
        if not deadline.fired:
            return False
        deadline.fired = False  # its cancel is taken back here, once
        return deadline.task.uncancel() <= deadline.cancelling

    def disarm(self, deadline: Deadline) -> None:
        """In ``finally``: forget it; take its cancel back if nothing else did."""
        self.live.pop(deadline, None)
        if deadline.fired:  # fired, but what arrived was not its CancelledError
            deadline.fired = False
            deadline.task.uncancel()

    def close(self) -> None:
        """Stop sweeping once nothing is armed (deadlines still armed keep their sweep)."""
        if self.ticker is not None and not self.live:
            self.ticker.cancel()
            self.ticker = None

    def _expire_due(self) -> None:
        self.ticker = None
        live = self.live
        if not live:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        due: list[Deadline] = []
        for deadline in live:
            if deadline.at > now:
                break
            due.append(deadline)
        for deadline in due:
            del live[deadline]
            deadline.fired = True
            deadline.task.cancel()
        if live:
            self.ticker = loop.call_later(self.tick_s, self._expire_due)
