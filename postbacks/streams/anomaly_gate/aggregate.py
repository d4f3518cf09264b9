"""The one global aggregator: partials of every partition -> the global payout rate.

Runs in whichever gate instance owns the single partition of ``anomaly.partials.v1``.
Partials are cumulative per (partition, window): the roll-up keeps the last one, and the
*increase* over the previous value is added to the global seasonal baseline (a late
window's increase counts in the open window, like a late event). Its state is one scope
in the ``gate-global`` table, with the roll-up in ``extra`` and the offset of the last
partial counted -- so a partial read again after a crash changes nothing.

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
    Rollup,
    Trip,
    add,
    add_partial,
    prune,
    value_rate,
)
from postbacks.core.anomaly.persist import Tracked, Value, dump_scope, restore_scope
from postbacks.core.anomaly.rollup import partial, rollup_from_dict, rollup_to_dict
from postbacks.errors import DeadLetterError
from postbacks.metrics import ANOMALY_BASELINE, ANOMALY_SIGNALS, ANOMALY_WINDOW_PAYOUT
from postbacks.records import PayoutPartialRecord
from postbacks.streams.anomaly_gate.config import GateConfig, HaltBook

__all__ = ["GLOBAL_HIST", "GLOBAL_OPEN", "GlobalAggregator"]

log = logging.getLogger(__name__)
GLOBAL_HIST = "g:hist"
GLOBAL_OPEN = "g:open"


class GlobalAggregator:
    def __init__(self, config: GateConfig, halts: HaltBook, global_key: str) -> None:
        self.config = config
        self.halts = halts
        self.global_key = global_key
        self.tracked: Tracked | None = None
        self.rollup = Rollup()
        self._codec = codec_for("PayoutPartial")
        self._signalled_window: int | None = None

    def forget(self) -> None:
        self.tracked = None

    def _load(self, get: Callable[[str], Any]) -> Tracked:
        if self.tracked is None:
            try:
                t = restore_scope(get(GLOBAL_HIST), get(GLOBAL_OPEN))
                parts = t.extra.get("parts")
                self.rollup = rollup_from_dict(parts) if parts else Rollup()
            except ValueError as exc:
                log.error("unreadable global state (%s): starting it afresh", exc)
                t, self.rollup = restore_scope(None, None), Rollup()
            self.tracked = t
        return self.tracked

    def process(self, batch: list[tuple[int, bytes | None]], get: Callable[[str], Any],
                now_ms: int) -> tuple[list[tuple[str, Value]], list[Trip]]:
        """``batch`` is (offset, value) of partials; returns table writes and new trips."""
        t = self._load(get)
        trips: list[Trip] = []
        g, rollup, offset = t.state, self.rollup, t.offset
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
            p, w, total = pp["partition"], pp["window_start"], pp["total_micros"]
            delta = total - partial(rollup, p, w)
            rollup = add_partial(rollup, p, w, total)
            if delta > 0:
                g = add(g, w, delta)
            trip = self._evaluate(g, th)
            if trip is not None:
                self.halts.trip_now(trip, now_ms)
                trips.append(trip)
        if g.open_start is not None:
            rollup = prune(rollup, g.open_start - 2 * g.policy.window_ms)
        self.rollup = rollup
        t = dataclasses.replace(t, state=g, offset=offset,
                                extra={"parts": rollup_to_dict(rollup)})
        hist, open_, t = dump_scope(t)
        self.tracked = t
        writes = ([(GLOBAL_HIST, hist)] if hist is not None else []) + [(GLOBAL_OPEN, open_)]
        self._gauges()
        return writes, trips

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
