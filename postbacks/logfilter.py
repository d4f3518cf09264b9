"""Repeated client-library log lines, once per window.

Kafka client libraries log every retry: after a broker's loss the gate's aiokafka fetcher
logged ``Failed fetch messages from 2: NodeNotReadyError`` at ERROR ten times a second for
as long as the broker was away. :class:`RepeatFilter` lets the first line of a kind through
(same logger, level and message template), drops the same kind for ``window_s``, and adds
to the next one let through how many were dropped, so the log still says that it went on
and for how long, without burying every other line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

__all__ = ["RepeatFilter", "install"]

Key = tuple[str, int, str]


class RepeatFilter(logging.Filter):
    def __init__(self, prefixes: Sequence[str], window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)
        self.window_s = window_s
        self.clock = clock
        self._last: dict[Key, float] = {}
        self._dropped: dict[Key, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # One decision per record: the same filter sits on every handler, and the second
        # handler must not take the first one's pass for a repeat.
        decided = getattr(record, "_postbacks_repeat_ok", None)
        if decided is not None:
            return bool(decided)
        ok = self._decide(record)
        record._postbacks_repeat_ok = ok
        return ok

    def _decide(self, record: logging.LogRecord) -> bool:
        name = record.name
        if not any(name == p or name.startswith(p + ".") for p in self.prefixes):
            return True
        key = (name, record.levelno, str(record.msg))
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        if len(self._last) >= 1000:  # bounded: templates, not values, are the keys
            self._last.clear()
            self._dropped.clear()
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped and last is not None:
            record.msg = (f"{record.msg} ({dropped} more like this in the "
                          f"{now - last:.0f} s before, not logged)")
        return True


def install(prefixes: Sequence[str] = ("aiokafka", "kafka"), window_s: float = 10.0) -> None:
    """On every handler of the root logger (after ``logging.basicConfig``)."""
    f = RepeatFilter(prefixes, window_s)
    for handler in logging.getLogger().handlers:
        handler.addFilter(f)
