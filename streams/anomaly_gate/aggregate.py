"""The one global aggregator: partials of every partition -> the global payout rate.

Runs in whichever gate instance owns the single partition of ``anomaly.partials.v1``.
Partials are cumulative per (partition, window): the roll-up keeps the last one, and the
*increase* over the previous value is added to the global seasonal baseline (a late
window's increase counts in the open window, like a late event). Its state is one scope
in the ``gate-global`` table, with each partition's latest partial in ``extra`` and the
offset of the last partial counted -- so a partial read again after a crash changes
nothing, and one re-sent by a restarted gate (a lower source offset) neither.

A global trip needs the global value-rate mode at enforce; under detect it is a signal
(metric) once per window.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.anomaly import (
    GLOBAL_SCOPE,
    Detector,
    HaltState,
    Mode,
    SeasonalBaseline,
    Trip,
    add,
    baseline,
    close_until,
)
from postbacks.core.anomaly.detectors import trips as over_thresholds
from postbacks.core.anomaly.persist import Tracked, Value, dump_scope, restore_scope
from postbacks.errors import DeadLetterError
from postbacks.metrics import ANOMALY_BASELINE, ANOMALY_SIGNALS, ANOMALY_WINDOW_PAYOUT
from postbacks.records import PayoutPartialRecord
from streams.anomaly_gate.config import GateConfig, HaltBook
from topics import TOPICS

__all__ = ["GLOBAL_HIST", "GLOBAL_OPEN", "GlobalAggregator"]

log = logging.getLogger(__name__)
GLOBAL_HIST = "g:hist"
GLOBAL_OPEN = "g:open"


ACTIVE_MS = 60_000  # a partition silent this long (gate wall clock) stops holding windows open
UNHEARD_GRACE_MS = 10_000  # partitions never heard from hold windows open this long


def _ints(raw: object, n: int, what: str) -> list[tuple[int, ...]]:
    if not isinstance(raw, str):
        raise ValueError(f"global state: {what!r} must be a string")
    out = []
    for item in filter(None, raw.split(";")):
        try:
            values = tuple(int(x) for x in item.split(":"))
        except ValueError:
            raise ValueError(f"global state: bad {what} item {item!r}") from None
        if len(values) != n:
            raise ValueError(f"global state: bad {what} item {item!r}")
        out.append(values)
    return out


class GlobalAggregator:
    """The global payout per event-time window, summed over partitions, against its
    seasonal baseline.

    Partitions move through event time at their own pace (a backlog is read in chunks of
    hours per partition), so a window is *closed* -- its total fed to the baseline's
    history -- only when every active partition has moved past it (the watermark: the
    lowest current window among partitions heard from within ``ACTIVE_MS``; until every
    partition has been heard from, or ``UNHEARD_GRACE_MS`` has passed since the first
    partial, nothing closes). Until then
    its total keeps growing and is checked against its own slot's baseline as each partial
    arrives, so a sharp excess trips mid-window. Money for a window already closed (a
    partition waking up) counts in the oldest open window: late money still counts now.

    Per partition the latest partial (window, cumulative total, source offset, sent at) is
    kept; one with a source offset not above the last is stale (a gate re-deciding after a
    restart) and changes nothing.
    """

    def __init__(self, config: GateConfig, halts: HaltBook, global_key: str,
                 partitions: int = TOPICS.deliveries.partitions) -> None:
        self.config = config
        self.halts = halts
        self.global_key = global_key
        self.partitions = partitions  # unheard ones hold windows open for UNHEARD_GRACE_MS
        self._first_sent: int | None = None
        self.tracked: Tracked | None = None
        self.parts: dict[int, tuple[int, int, int, int]] = {}  # p -> (w, total, src, sent)
        self.windows: dict[int, int] = {}  # open window start -> total so far
        self._codec = codec_for("PayoutPartial")
        self._signalled_window: int | None = None
        self._dirty = False

    def forget(self) -> None:
        self.tracked = None

    def _load(self, get: Callable[[str], Any]) -> Tracked:
        if self.tracked is None:
            try:
                t = restore_scope(get(GLOBAL_HIST), get(GLOBAL_OPEN))
                self.parts = {v[0]: (v[1], v[2], v[3], v[4])
                              for v in _ints(t.extra.get("parts", ""), 5, "parts")}
                self.windows = {w: total for w, total in _ints(t.extra.get("wins", ""), 2,
                                                                "wins")}
                first = t.extra.get("first")
                self._first_sent = first if type(first) is int else None
            except ValueError as exc:
                log.error("unreadable global state (%s): starting it afresh", exc)
                t, self.parts, self.windows = restore_scope(None, None), {}, {}
            self.tracked = t
        return self.tracked

    def window_total(self, window_start: int) -> int:
        return self.windows.get(window_start, 0)

    def process(self, batch: list[tuple[int, bytes | None]], get: Callable[[str], Any],
                now_ms: int) -> list[Trip]:
        """``batch`` is (offset, value) of partials; returns the trips it caused."""
        t = self._load(get)
        trips: list[Trip] = []
        g, offset = t.state, t.offset
        for off, raw in batch:
            if off <= offset:
                continue  # counted before a restart
            offset = off
            try:
                pp: PayoutPartialRecord = self._codec.decode(raw)  # type: ignore[assignment]
            except DeadLetterError as exc:
                log.error("partials offset %d: %s (skipped)", off, exc)
                continue
            p, w, total = pp["partition"], pp["window_start"], pp["total_micros"]
            src, sent = pp["source_offset"], pp["produced_at"]
            last = self.parts.get(p)
            if last is not None and (src <= last[2] or w < last[0]):
                continue  # stale (re-sent after a gate restart); windows never move back
            delta = total - last[1] if last is not None and w == last[0] else total
            self.parts[p] = (w, total, src, sent)
            target = w if g.open_start is None or w >= g.open_start else g.open_start
            if delta > 0:
                self.windows[target] = self.windows.get(target, 0) + delta
            g = self._close(g)
            trip = self._evaluate(g, target)
            if trip is not None:
                self.halts.trip_now(trip, now_ms)
                trips.append(trip)
        self.tracked = dataclasses.replace(t, state=g, offset=offset)
        self._dirty = True
        self._gauges()
        return trips

    def _close(self, g: SeasonalBaseline) -> SeasonalBaseline:
        """Feed every window below the watermark to the baseline, oldest first."""
        if not self.parts:
            return g
        newest = max(v[3] for v in self.parts.values())
        first = self._first_sent = min(self._first_sent or newest, newest)
        if len(self.parts) < self.partitions and newest - first < UNHEARD_GRACE_MS:
            return g  # a partition not heard from yet may still bring these windows money
        watermark = min(v[0] for v in self.parts.values() if v[3] >= newest - ACTIVE_MS)
        for w in sorted(x for x in self.windows if x < watermark):
            g = close_until(add(g, w, self.windows.pop(w)), w + g.policy.window_ms)
        if g.open_start is not None and g.open_start < watermark:
            g = close_until(g, watermark)
        return g

    def take_writes(self) -> list[tuple[str, Value]]:
        """The table writes for the state changed since the last call (before a commit)."""
        if not self._dirty or self.tracked is None:
            return []
        parts = ";".join(f"{p}:{w}:{t}:{o}:{a}" for p, (w, t, o, a) in sorted(self.parts.items()))
        wins = ";".join(f"{w}:{t}" for w, t in sorted(self.windows.items()))
        extra: dict[str, Any] = {"parts": parts, "wins": wins, "first": self._first_sent}
        t = dataclasses.replace(self.tracked, extra=extra)
        hist, open_, self.tracked = dump_scope(t)
        self._dirty = False
        return ([(GLOBAL_HIST, hist)] if hist is not None else []) + [(GLOBAL_OPEN, open_)]

    def _evaluate(self, g: SeasonalBaseline, w: int) -> Trip | None:
        mode = self.config.global_mode
        if mode is Mode.OFF:
            return None
        total, b = self.windows.get(w, 0), baseline(g, w)
        if b is None or not over_thresholds(total, b, self.config.global_thresholds):
            return None
        if self._signalled_window != w:
            self._signalled_window = w
            ANOMALY_SIGNALS.labels("payout_rate_global", mode.value).inc()
        if mode is Mode.ENFORCE and self.halts.halts.get(GLOBAL_SCOPE) is not HaltState.TRIPPED:
            return Trip("global", "*", Detector.VALUE_RATE, total, b, w)
        return None

    def _gauges(self) -> None:
        if self.tracked is None or not self.windows:
            return
        w = max(self.windows)
        ANOMALY_WINDOW_PAYOUT.labels("global", self.global_key).set(self.windows[w] / 1e6)
        b = baseline(self.tracked.state, w)
        if b is not None:
            ANOMALY_BASELINE.labels("global", self.global_key).set(b / 1e6)
