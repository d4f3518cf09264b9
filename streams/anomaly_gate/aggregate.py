"""The one global aggregator: partials of every partition -> the global rolling payout rate.

Runs in whichever gate instance owns the single partition of ``anomaly.partials.v1``.
Partials are cumulative per (partition, event-time minute): the roll-up keeps the last
one, and the *increase* (payout and count) over the previous value is added to that minute
of the global total (a late minute's increase counts in the oldest open minute, like a
late event). Closed minutes feed the global :class:`~postbacks.core.anomaly.rolling.RollingState`;
once per batch of partials the rolling detector scores every span (5, 15, 60 minutes)
ending at the newest minute, open minutes included, against the seasonal expectation for
the same span. Its state is the ``g:roll`` key of the ``gate-global`` table (the rolling
state, each partition's latest partial, the open minutes and the offset of the last
partial counted) -- so a partial read again after a crash changes nothing, and one re-sent
by a restarted gate (a lower source offset) neither.

A global trip needs the global value-rate mode at enforce; under detect it is a signal
(metric) once per span start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.anomaly import GLOBAL_SCOPE, Detector, HaltState, Mode, Trip
from postbacks.core.anomaly.persist import NOTHING, Value
from postbacks.core.anomaly.profile import MINUTE_MS
from postbacks.core.anomaly.retro_burst import (
    NO_BURST,
    BurstResult,
    BurstState,
    close_minute,
    forget_span,
    format_burst,
    judge,
    parse_burst,
)
from postbacks.core.anomaly.rolling import (
    RollingOver,
    RollingResult,
    RollingState,
    RollingWithin,
    advance,
    arm_scores,
    describe,
    empty,
    evaluate,
    reset_arms,
)
from postbacks.core.anomaly.rolling import add as rolling_add
from postbacks.core.anomaly.rolling_codec import from_dict, to_dict
from postbacks.errors import DeadLetterError
from postbacks.metrics import (
    ANOMALY_CUSUM,
    ANOMALY_GLOBAL_WATERMARK,
    ANOMALY_RETRO_BURST,
    ANOMALY_SIGNALS,
    ANOMALY_SPAN_EXPECTED,
    ANOMALY_SPAN_OBSERVED,
    ANOMALY_SPAN_SCORE,
    GATE_AGGREGATOR,
)
from postbacks.records import PayoutPartialRecord
from streams.anomaly_gate.config import GateConfig, HaltBook
from topics import TOPICS

__all__ = ["GLOBAL_ROLL", "PARTIAL_WINDOW_MS", "SCORED_OPEN_MINUTES",
           "GlobalAggregator", "owns"]

log = logging.getLogger(__name__)
GLOBAL_ROLL = "g:roll"
PARTIAL_WINDOW_MS = MINUTE_MS  # the partials' event-time window


ACTIVE_MS = 60_000  # a partition silent this long (gate wall clock) stops holding windows open
UNHEARD_GRACE_MS = 10_000  # partitions never heard from hold windows open this long
# Scoring adds the open minutes to a copy of the state, oldest first, at most this many: a
# live gate has one or two open; a backlog read at different paces per partition can hold
# hours or days of them, each known only in part, and adding all of them to the copy on
# every batch cost the gate most of its CPU. The spans then end at the newest minute added,
# the one nearest to complete.
SCORED_OPEN_MINUTES = 10


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


def owns(assigned: Any, partials_topic: str, was: bool | None) -> bool:
    """Whether this instance's assignment (a set of TopicPartitions) holds the partials
    topic; logs and sets ``postbacks_gate_aggregator`` when that changes."""
    now = any(tp.topic == partials_topic for tp in assigned)
    if now != was:
        GATE_AGGREGATOR.set(1 if now else 0)
        if not now:
            ANOMALY_GLOBAL_WATERMARK.set(0)  # another instance's figure from now on
        log.info("global aggregator: %s", "this instance runs the global roll-up" if now
                 else "the global roll-up runs in another instance")
    return now


class GlobalAggregator:
    """The global payout and count per event-time minute, summed over partitions, through
    the rolling detector.

    Partitions move through event time at their own pace (a backlog is read in chunks of
    hours per partition), so a minute is *closed* -- fed to the rolling state -- only when
    every active partition has moved past it (the watermark: the lowest current minute
    among partitions heard from within ``ACTIVE_MS``; until every partition has been heard
    from, or ``UNHEARD_GRACE_MS`` has passed since the first partial, nothing closes).
    Open minutes keep growing and count in the score as far as they are known, so a sharp
    excess trips within the minute. Money for a minute already closed (a partition waking
    up) counts in the oldest open minute: late money still counts now.

    Per partition the latest partial (minute, cumulative total, count, source offset, sent
    at) is kept; one with a source offset not above the last is stale (a gate re-deciding
    after a restart) and changes nothing.
    """

    def __init__(self, config: GateConfig, halts: HaltBook, global_key: str,
                 partitions: int = TOPICS.deliveries.partitions) -> None:
        self.config = config
        self.halts = halts
        self.global_key = global_key
        self.partitions = partitions  # unheard ones hold windows open for UNHEARD_GRACE_MS
        self._first_sent: int | None = None
        self.loaded = False
        self.state: RollingState = empty()
        self.offset = NOTHING
        # p -> (minute start, total, count, source offset, sent at, retrodated)
        self.parts: dict[int, tuple[int, int, int, int, int, int]] = {}
        # open minute start -> (total, count, retrodated)
        self.windows: dict[int, tuple[int, int, int]] = {}
        self.burst: BurstState = NO_BURST  # the retrodated burst's closed minutes
        self.last_burst: BurstResult | None = None
        self._burst_signalled: int | None = None
        self._codec = codec_for("PayoutPartial")
        self._signalled: int | None = None
        self._dirty = False
        self.last: RollingResult | None = None
        # Re-armed from a close: spans judge only minutes from ``since`` (the minute after
        # the newest one known when the close was seen), so a halt closed while its
        # incident is still in a span does not trip on the same money again. ``halted`` is
        # persisted so an instance taking over mid-halt re-arms at the close too.
        self.halted = False
        self.since: int | None = None

    def forget(self) -> None:
        self.loaded = False

    def _load(self, get: Callable[[str], Any]) -> None:
        if self.loaded:
            return
        raw = get(GLOBAL_ROLL)
        self.state, self.offset, self.parts, self.windows = empty(), NOTHING, {}, {}
        self.burst = NO_BURST
        self._first_sent = None
        self.halted, self.since = False, None
        if raw is not None:
            try:
                if not isinstance(raw, dict) or type(raw.get("o")) is not int:
                    raise ValueError("global state: not an object with an offset")
                self.state = from_dict(raw["s"])
                # The retrodated counts are kept apart (``parts_r``, ``wins_r``), so a release
                # from before them still reads this state whole after a rollback.
                retro_p = {p: r for p, r in _ints(raw.get("parts_r", ""), 2, "parts_r")}
                retro_w = {w: r for w, r in _ints(raw.get("wins_r", ""), 2, "wins_r")}
                self.parts = {v[0]: (v[1], v[2], v[3], v[4], v[5], retro_p.get(v[0], 0))
                              for v in _ints(raw.get("parts", ""), 6, "parts")}
                self.windows = {w: (t, c, retro_w.get(w, 0))
                                for w, t, c in _ints(raw.get("wins", ""), 3, "wins")}
                first = raw.get("first")
                self._first_sent = first if type(first) is int else None
                since = raw.get("since")
                self.since = since if type(since) is int else None
                self.halted = raw.get("halted") is True
                self.offset = raw["o"]
                self.burst = self._load_burst(raw.get("burst"))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("unreadable global state (%s): starting it afresh", exc)
                self.state, self.offset, self.parts, self.windows = empty(), NOTHING, {}, {}
                self.burst = NO_BURST
        self.loaded = True

    @staticmethod
    def _load_burst(raw: object) -> BurstState:
        """The retrodated burst's state; unreadable (or absent) starts it afresh, and
        leaves the rolling state and the offset as read."""
        if raw is None:
            return NO_BURST
        try:
            return parse_burst(raw)
        except ValueError as exc:
            log.error("unreadable retrodated burst state (%s): starting it afresh", exc)
            return NO_BURST

    def window_total(self, window_start: int) -> int:
        return self.windows.get(window_start, (0, 0))[0]

    def _closed_before(self) -> int | None:
        m = self.state.minute
        return None if m is None else m * MINUTE_MS

    def process(self, batch: list[tuple[int, bytes | None]], get: Callable[[str], Any],
                now_ms: int) -> list[Trip]:
        """``batch`` is (offset, value) of partials; returns the trips it caused (the
        detector runs once per batch, after every partial in it is counted)."""
        self._load(get)
        moved = False
        for off, raw in batch:
            if off <= self.offset:
                continue  # counted before a restart
            self.offset = off
            moved = True
            try:
                pp: PayoutPartialRecord = self._codec.decode(raw)  # type: ignore[assignment]
            except DeadLetterError as exc:
                log.error("partials offset %d: %s (skipped)", off, exc)
                continue
            p, w, total, count = (pp["partition"], pp["window_start"], pp["total_micros"],
                                  pp["count"])
            retro = pp.get("retrodated", 0)
            src, sent = pp["source_offset"], pp["produced_at"]
            last = self.parts.get(p)
            if last is not None and (src <= last[3] or w < last[0]):
                continue  # stale (re-sent after a gate restart); windows never move back
            same = last is not None and w == last[0]
            dv = total - last[1] if last is not None and same else total
            dc = count - last[2] if last is not None and same else count
            dr = retro - last[5] if last is not None and same else retro
            self.parts[p] = (w, total, count, src, sent, retro)
            closed = self._closed_before()
            target = w if closed is None or w >= closed else closed
            if target != w and w < target - (self.config.retro_burst.span - 1) * MINUTE_MS:
                # A retrodated count for a minute out of the burst's span by event time (a
                # partition that caught up): counted in no minute, so that a lagging
                # partition's backlog cannot pile up into one minute and trip the burst.
                dr = 0
            if dv > 0 or dc > 0 or dr > 0:
                t0, c0, r0 = self.windows.get(target, (0, 0, 0))
                self.windows[target] = (t0 + max(dv, 0), c0 + max(dc, 0), r0 + max(dr, 0))
        if not moved:
            return []
        self._close()
        self._dirty = True
        trip = self._evaluate()
        if trip is not None:
            self.halts.trip_now(trip, now_ms)
            self.halted = True
            return [trip]
        return []

    def _close(self) -> None:
        """Feed every minute below the watermark to the rolling state, oldest first."""
        if not self.parts:
            return
        newest = max(v[4] for v in self.parts.values())
        first = self._first_sent = min(self._first_sent or newest, newest)
        if len(self.parts) < self.partitions and newest - first < UNHEARD_GRACE_MS:
            return  # a partition not heard from yet may still bring these minutes money
        watermark = min(v[0] for v in self.parts.values() if v[4] >= newest - ACTIVE_MS)
        s, b, policy = self.state, self.burst, self.config.retro_burst
        for w in sorted(x for x in self.windows if x < watermark):
            total, count, retro = self.windows.pop(w)
            s = rolling_add(s, w, total, count, learn=not self.halted)
            b = close_minute(b, w // MINUTE_MS, retro, policy, learn=not self.halted)
        if s.minute is not None:
            s = advance(s, watermark // MINUTE_MS, learn=not self.halted)
            ANOMALY_GLOBAL_WATERMARK.set((s.minute or 0) * MINUTE_MS / 1000)
        if b.minute is not None and b.minute < watermark // MINUTE_MS - 1:
            b = close_minute(b, watermark // MINUTE_MS - 1, 0, policy,  # quiet minutes
                             learn=not self.halted)
        self.state, self.burst = s, b

    def _evaluate(self) -> Trip | None:
        mode, retro_mode = self.config.global_mode, self.config.global_retro_mode
        if mode is Mode.OFF and retro_mode is Mode.OFF:
            self.last = self.last_burst = None
            return None
        self._rearm()
        if retro_mode is Mode.OFF:
            self.last_burst = None
            ANOMALY_RETRO_BURST.labels("observed").set(0)
            ANOMALY_RETRO_BURST.labels("threshold").set(0)
        trip = self._burst(retro_mode) if retro_mode is not Mode.OFF else None
        if mode is Mode.OFF:
            self.last = None
            return trip
        rolled = self._rolling(mode)  # its gauges and signals whatever the burst did
        return trip or rolled

    def _burst(self, mode: Mode) -> Trip | None:
        """The retrodated burst over the span ending at the newest open minute (the open
        minutes before it closed into a copy, as the rolling score adds them)."""
        b, policy = self.burst, self.config.retro_burst
        opens = sorted(self.windows)[:SCORED_OPEN_MINUTES]
        for w in opens[:-1]:
            b = close_minute(b, w // MINUTE_MS, self.windows[w][2], policy)
        last = opens[-1] if opens else None
        r = self.last_burst = judge(b, None if last is None else last // MINUTE_MS,
                                    0 if last is None else self.windows[last][2], policy,
                                    since_minute=self.since)
        ANOMALY_RETRO_BURST.labels("observed").set(r.observed)
        ANOMALY_RETRO_BURST.labels("threshold").set(r.threshold)
        if not r.over:
            return None
        end = last // MINUTE_MS if last is not None else (b.minute or 0)
        start_ms = (end - r.seen + 1) * MINUTE_MS
        if self._burst_signalled != start_ms:
            self._burst_signalled = start_ms
            ANOMALY_SIGNALS.labels("retrodated_burst", mode.value).inc()
        if mode is Mode.ENFORCE and self.halts.halts.get(GLOBAL_SCOPE) is not HaltState.TRIPPED:
            log.warning("retrodated burst over its threshold: %s", r.describe())
            return Trip("global", "*", Detector.RETRODATING, r.observed, r.usual, start_ms,
                        r.describe())
        return None

    def _rolling(self, mode: Mode) -> Trip | None:
        s = self.state
        for w in sorted(self.windows)[:SCORED_OPEN_MINUTES]:  # as far as they are known
            total, count, _retro = self.windows[w]
            s = rolling_add(s, w, total, count)
        r = self.last = evaluate(s, self.config.global_rolling, since_minute=self.since)
        self._gauges(r)
        for a in arm_scores(s):
            ANOMALY_CUSUM.labels("global", a.arm).set(a.score)
        if not isinstance(r, RollingOver):
            return None
        if self._signalled != r.window_start_ms:
            self._signalled = r.window_start_ms
            ANOMALY_SIGNALS.labels("payout_rate_global", mode.value).inc()
        if mode is Mode.ENFORCE and self.halts.halts.get(GLOBAL_SCOPE) is not HaltState.TRIPPED:
            log.warning("global rolling detector over its thresholds: %s", describe(r))
            return Trip("global", "*", Detector.VALUE_RATE, r.over.observed_micros,
                        r.over.expected_micros, r.window_start_ms, describe(r))
        return None

    def _rearm(self) -> None:
        """A tripped -> closed seen since the last batch: judge from the minute after the
        newest one known (that minute holds money from before the close: the incident's,
        when it is closed the moment the incident ends)."""
        halted = self.halts.halts.get(GLOBAL_SCOPE) is HaltState.TRIPPED
        if halted == self.halted:
            return
        self.halted = halted
        if not halted:
            newest = max(self.windows, default=None)
            m = newest // MINUTE_MS if newest is not None else self.state.minute
            if m is not None:
                self.since = m + 1
                self.state = reset_arms(self.state, self.since)
                self.burst = forget_span(self.burst)
                log.warning("global halt closed: the rolling spans judge from event time"
                            " %s (epoch ms) on", self.since * MINUTE_MS)

    def take_writes(self) -> list[tuple[str, Value]]:
        """The table write for the state changed since the last call (before a commit)."""
        if not self._dirty or not self.loaded:
            return []
        parts = ";".join(f"{p}:{w}:{t}:{c}:{o}:{a}"
                         for p, (w, t, c, o, a, _r) in sorted(self.parts.items()))
        parts_r = ";".join(f"{p}:{v[5]}" for p, v in sorted(self.parts.items()) if v[5])
        wins = ";".join(f"{w}:{t}:{c}" for w, (t, c, _r) in sorted(self.windows.items()))
        wins_r = ";".join(f"{w}:{r}" for w, (_t, _c, r) in sorted(self.windows.items()) if r)
        self._dirty = False
        return [(GLOBAL_ROLL, {"s": to_dict(self.state), "o": self.offset, "parts": parts,
                               "parts_r": parts_r, "wins": wins, "wins_r": wins_r,
                               "first": self._first_sent, "since": self.since,
                               "halted": self.halted, "burst": format_burst(self.burst)})]

    def _gauges(self, r: RollingResult) -> None:
        if not isinstance(r, RollingOver | RollingWithin):
            return
        for sc in r.scores:
            span = str(sc.span)
            ANOMALY_SPAN_OBSERVED.labels("global", span).set(sc.observed_micros / 1e6)
            ANOMALY_SPAN_EXPECTED.labels("global", span).set(sc.expected_micros / 1e6)
            ANOMALY_SPAN_SCORE.labels("global", span, "value").set(sc.score)
            ANOMALY_SPAN_SCORE.labels("global", span, "count").set(sc.count_score)
