"""How long an asyncio event loop is kept from running its callbacks, and where.

A task on the loop notes the time every ``interval_s``; the overshoot of each sleep is the
loop's lag (``postbacks_event_loop_lag_seconds``): the wait every ready callback — a
finished HTTP response, a consumed batch — had on top of its own work. A thread beside it
checks the note: when the loop has not come back for ``report_s``, it logs the loop
thread's stack once for that stall (at most one report per ``quiet_s``), so the code that
blocked the loop is named in the log rather than guessed. With ``restart_after_s``, a
loop that has not come back for that long restarts the process in place (every thread's
stack in the log first): a process whose loop is stuck still answers ``/metrics`` from its
own thread, so no probe would notice.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback

from postbacks.kafka import watchdog
from postbacks.metrics import LOOP_LAG

__all__ = ["LoopWatch"]

log = logging.getLogger(__name__)


class LoopWatch:
    def __init__(self, process: str, *, interval_s: float = 0.01, report_s: float = 0.1,
                 quiet_s: float = 10.0, restart_after_s: float | None = None) -> None:
        self._process = process
        self._restart_after = restart_after_s
        self._lag = LOOP_LAG.labels(process=process)
        self._interval = interval_s
        self._report = report_s
        self._quiet = quiet_s
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self.reports = 0

    def start(self) -> None:
        """Start watching the running loop (call from a coroutine on it)."""
        loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        self._thread = threading.Thread(target=self._check, args=(loop_thread,),
                                        name="loopwatch", daemon=True)
        self._thread.start()

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self._interval)
            self._beat = now = time.monotonic()
            self._lag.observe(max(0.0, now - before - self._interval))

    def _check(self, loop_thread: int) -> None:
        reported_beat = 0.0
        last_report = -self._quiet
        while not self._stop.wait(self._report / 4):
            beat = self._beat
            now = time.monotonic()
            if self._restart_after is not None and now - beat > self._restart_after:
                watchdog.restart_in_place(f"{self._process}: the event loop has not turned "
                                          f"for {now - beat:.0f} s", dump=True, backoff_s=1.0)
            if (now - beat < self._report or beat == reported_beat
                    or now - last_report < self._quiet):
                continue
            frame = sys._current_frames().get(loop_thread)
            if frame is None:
                continue
            reported_beat, last_report = beat, now
            self.reports += 1
            stack = "".join(traceback.format_stack(frame)[-8:])  # the innermost frames
            log.warning("event loop blocked for %.0f ms so far, in:\n%s",
                        (now - beat) * 1000, stack)

    def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
        if self._thread is not None:
            self._thread.join(1)
