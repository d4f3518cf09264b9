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
    Over,
    Trip,
    add,
    value_rate,
)
from postbacks.core.anomaly.persist import Tracked, Value, dump_scope, restore_scope
from postbacks.errors import DeadLetterError
from postbacks.metrics import ANOMALY_BASELINE, ANOMALY_SIGNALS, ANOMALY_WINDOW_PAYOUT
from postbacks.records import PayoutPartialRecord
from postbacks.streams.anomaly_gate.config import GateConfig, HaltBook

__all__ = ["GLOBAL_HIST", "GLOBAL_OPEN", "GlobalAggregator"]

log = logging.getLogger(__name__)
GLOBAL_HIST = "g:hist"
GLOBAL_OPEN = "g:open"


def _parts_to_str(parts: dict[int, tuple[int, int, int]]) -> str:
    return ";".join(f"{p}:{w}:{t}:{o}" for p, (w, t, o) in sorted(parts.items()))


def _parts_from_str(raw: object) -> dict[int, tuple[int, int, int]]:
    if not isinstance(raw, str):
        raise ValueError("global state: 'parts' must be a string")
    out: dict[int, tuple[int, int, int]] = {}
    for item in filter(None, raw.split(";")):
        try:
            p, w, t, o = (int(x) for x in item.split(":"))
        except ValueError:
            raise ValueError(f"global state: bad part {item!r}") from None
        out[p] = (w, t, o)
    return out


class GlobalAggregator:
    """Per partition the latest partial (window, cumulative total, source offset) and the
    global baseline fed with each partial's increase.

    A partial whose source offset is not above the partition's last one is stale (a gate
    re-deciding deliveries after a restart) and changes nothing. A partition's partials
    only move forward in window, so one entry per partition is all the state there is.
    """

    def __init__(self, config: GateConfig, halts: HaltBook, global_key: str) -> None:
        self.config = config
        self.halts = halts
        self.global_key = global_key
        self.tracked: Tracked | None = None
        self.parts: dict[int, tuple[int, int, int]] = {}
        self._codec = codec_for("PayoutPartial")
        self._signalled_window: int | None = None
        self._dirty = False

    def forget(self) -> None:
        self.tracked = None

    def _load(self, get: Callable[[str], Any]) -> Tracked:
        if self.tracked is None:
            try:
                t = restore_scope(get(GLOBAL_HIST), get(GLOBAL_OPEN))
                self.parts = _parts_from_str(t.extra.get("parts", ""))
            except ValueError as exc:
                log.error("unreadable global state (%s): starting it afresh", exc)
                t, self.parts = restore_scope(None, None), {}
            self.tracked = t
        return self.tracked

    def process(self, batch: list[tuple[int, bytes | None]], get: Callable[[str], Any],
                now_ms: int) -> list[Trip]:
        """``batch`` is (offset, value) of partials; returns the trips it caused."""
        t = self._load(get)
        trips: list[Trip] = []
        g, offset = t.state, t.offset
        th = self.config.global_thresholds
        for off, raw in batch:
            if off <= offset:
                continue  # counted before a restart
            offset = off
            try:
                pp: PayoutPartialRecord = self._codec.decode(raw)  # type: ignore[assignment]
            except DeadLetterError as exc:
                log.error("partials offset %d: %s (skipped)", off, exc)
                continue
            p, w, total, src = (pp["partition"], pp["window_start"], pp["total_micros"],
                                pp["source_offset"])
            last = self.parts.get(p)
            if last is not None and src <= last[2]:
                continue  # stale: re-sent after a gate restart
            if last is not None and w < last[0]:
                continue  # a partition's window never moves back; ignore defensively
            delta = total - last[1] if last is not None and w == last[0] else total
            self.parts[p] = (w, total, src)
            if delta > 0:
                g = add(g, w, delta)
            trip = self._evaluate(g, th)
            if trip is not None:
                self.halts.trip_now(trip, now_ms)
                trips.append(trip)
        self.tracked = dataclasses.replace(t, state=g, offset=offset)
        self._dirty = True
        self._gauges()
        return trips

    def take_writes(self) -> list[tuple[str, Value]]:
        """The table writes for the state changed since the last call (before a commit)."""
        if not self._dirty or self.tracked is None:
            return []
        t = dataclasses.replace(self.tracked, extra={"parts": _parts_to_str(self.parts)})
        hist, open_, self.tracked = dump_scope(t)
        self._dirty = False
        return ([(GLOBAL_HIST, hist)] if hist is not None else []) + [(GLOBAL_OPEN, open_)]
    def _evaluate(self, g: Any, th: Any) -> Trip | None:
        mode = self.config.global_mode
        if mode is Mode.OFF:
            return None
        r = value_rate(g, th)
        if not isinstance(r, Over):
            return None
        if self._signalled_window != r.window_start_ms:
            self._signalled_window = r.window_start_ms
            ANOMALY_SIGNALS.labels("payout_rate_global", mode.value).inc()
        if mode is Mode.ENFORCE and self.halts.halts.get(GLOBAL_SCOPE) is not HaltState.TRIPPED:
            return Trip("global", "*", Detector.VALUE_RATE, r.observed_micros,
                        r.baseline_micros, r.window_start_ms)
        return None

    def _gauges(self) -> None:
        if self.tracked is None:
            return
        st = self.tracked.state
        ANOMALY_WINDOW_PAYOUT.labels("global", self.global_key).set(st.open_total / 1e6)
        if st.open_baseline is not None:
            ANOMALY_BASELINE.labels("global", self.global_key).set(st.open_baseline / 1e6)
