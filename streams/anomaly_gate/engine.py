"""The gate's per-batch work, synchronous and free of Faust (the runner does the I/O).

For each delivery of a batch, in offset order per partition:

1. decode (undecodable, misplaced or too large -> a dead letter: :mod:`.placement`);
2. count its payout in the endpoint's rolling state and the partition's partial --
   unless its offset is at or below the one persisted with that state (a re-processed
   delivery after a crash is decided again, never counted twice: see
   :mod:`postbacks.core.anomaly.endpoint_state`);
3. score the endpoint's rolling spans at the delivery's event time (only where its value
   rate is armed) and ``decide`` under the current modes and halts; a trip under enforce
   halts the scope here at once (every later delivery in the batch sees it) and is
   returned for the runner to persist and broadcast;
4. dispatch (``dispatch.v1``) or hold (``held.v1`` plus a ``held`` outcome).

The batch returns its outputs and the partials for the global aggregator; the table writes
for the state it changed are taken with :meth:`GateEngine.take_writes` before each commit.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.anomaly import (
    DEFAULT_WINDOW_MS,
    Hold,
    MissingInputs,
    Mode,
    PartitionPartial,
    RateResult,
    accumulate,
    decide,
    payout_input,
    retrodated,
)
from postbacks.core.anomaly.detectors import (
    MAX_AHEAD_MS,
    MAX_PAYOUT_MICROS,
    NO_BASELINE,
    event_time_input,
)
from postbacks.core.anomaly.endpoint_state import EndpointState, dump, restore
from postbacks.core.anomaly.modes import GLOBAL_SCOPE, HoldReason
from postbacks.core.anomaly.outlier import describe_outlier, judge, note, verdict, with_verdict
from postbacks.core.anomaly.persist import (
    NOTHING,
    Value,
    dump_partial,
    restore_partial,
)
from postbacks.core.anomaly.rolling import (
    RollingOver,
    RollingResult,
    as_rate_result,
    describe,
    evaluate,
    reset_arms,
)
from postbacks.core.anomaly.rolling import add as rolling_add
from postbacks.core.anomaly.windows import counted_at
from postbacks.core.instants import MIN_OCCURRED_AT_MS
from postbacks.core.outcomes import make_outcome
from postbacks.errors import DeadLetterError
from postbacks.metrics import (
    ANOMALY_ENDPOINT_SPAN_EXPECTED,
    ANOMALY_ENDPOINT_SPAN_OBSERVED,
    ANOMALY_ENDPOINT_SPAN_SCORE,
    GATE_DECISIONS,
    child,
)
from postbacks.records import DeliveryRecord
from streams.anomaly_gate.config import GateConfig, HaltBook
from streams.anomaly_gate.engine_io import (
    BatchOut,
    In,
    count_signals,
    dead_letter,
    open_key,
    partial_key,
    profile_key,
    ring_key,
)
from streams.anomaly_gate.placement import check_placed
from topics import TOPICS

_NO_RUN = (0, -1)  # an empty run of decided offsets

__all__ = ["BatchOut", "GateEngine", "In", "open_key", "partial_key", "profile_key",
           "ring_key"]

log = logging.getLogger(__name__)
SCOPE = "endpoint"


class GateEngine:
    """Per-endpoint and per-partition state (cached from the table) and the decisions."""

    def __init__(self, config: GateConfig, halts: HaltBook, window_ms: int = DEFAULT_WINDOW_MS,
                 partials_interval_ms: int = 0, partitions: int = 0) -> None:
        self.config = config
        self.partitions = partitions  # of deliveries.v1 (0: a delivery's is not checked)
        self.halts = halts
        self.window_ms = window_ms
        self.partials_interval_ms = partials_interval_ms
        self.scopes: dict[str, EndpointState] = {}
        self.scores: dict[str, RollingResult] = {}  # armed endpoints' latest, for gauges
        self._gauged: set[str] = set()  # endpoints with gauge series
        self.partials: dict[int, tuple[PartitionPartial, int]] = {}
        self._dirty_eps: dict[str, int] = {}  # endpoint -> partition, changed since written
        self._dirty_parts: set[int] = set()
        self._unsent_parts: set[int] = set()  # partitions whose partial moved since sent
        # partition -> (lowest, highest) offset of the run decided since assigned
        self._done: dict[int, tuple[int, int]] = {}
        self._partials_sent_ms = 0
        self._delivery = codec_for("Delivery")
        self._outcome = codec_for("Outcome")
        self._dlq = codec_for("DeadLetter")

    def forget(self) -> None:
        """Drop the cache (after a rebalance the table is the truth); the caller has taken
        the writes and the unsent partials first."""
        self.scopes.clear()
        self.partials.clear()
        self._unsent_parts.clear()
        self._done.clear()
        self.scores.clear()
        self.gauges()

    def _scope(self, ep: str, get: Callable[[str], Any]) -> EndpointState:
        t = self.scopes.get(ep)
        if t is None:
            try:
                t = restore(get(profile_key(ep)), get(ring_key(ep)), get(open_key(ep)))
            except ValueError as exc:
                log.error("endpoint %s: unreadable gate state (%s): starting it afresh", ep, exc)
                t = restore(None, None, None)
            self.scopes[ep] = t
        return t

    def _rearm(self, ep: str, t: EndpointState, halted: bool) -> EndpointState:
        """The endpoint's halt was tripped or closed since its last delivery. A close: its
        spans judge from the minute after the newest known (that minute's money came before
        the close), its CUSUM arms from zero."""
        t = dataclasses.replace(t, halted=halted)
        if not halted and t.state.minute is not None:
            since = t.state.minute + 1
            t = dataclasses.replace(t, state=reset_arms(t.state, since), since=since)
            log.warning("endpoint %s: halt closed: its rolling spans judge from event time "
                        "%d (epoch ms) on", ep, since * 60_000)
        self.scopes[ep] = t
        return t

    def _partial(self, p: int, get: Callable[[str], Any]) -> tuple[PartitionPartial, int]:
        got = self.partials.get(p)
        if got is None:
            try:
                got = restore_partial(get(partial_key(p)))
            except ValueError as exc:
                log.error("partition %d: unreadable partial (%s): starting afresh", p, exc)
                got = (PartitionPartial(), NOTHING)
            self.partials[p] = got
        return got

    def process(self, batch: list[In], get: Callable[[str], Any], now_ms: int) -> BatchOut:
        out = BatchOut()
        touched: dict[str, int] = {}  # endpoint -> partition
        parts: set[int] = set()
        cfg, halts = self.config, self.halts.halts
        done = self._done
        for rec in batch:
            # Faust hands a partition's last record over again after a pause of its fetch
            # (4 of 60,000 in `make demo`), its outputs produced: only offsets in the run
            # decided since the assignment are skipped (one below it, sought back, starts a
            # new run). A rebalance clears the runs (forget); a restart starts empty.
            lo, hi = done.get(rec.partition, _NO_RUN)
            if lo <= rec.offset <= hi:
                out.redelivered += 1
                continue
            done[rec.partition] = (lo if lo <= hi < rec.offset else rec.offset, rec.offset)
            try:
                d: DeliveryRecord = self._delivery.decode(rec.value)  # type: ignore[assignment]
                check_placed(rec.key, len(rec.value or b""), rec.partition, d["endpoint_id"],
                             self.partitions)  # else neither counted nor judged
            except DeadLetterError as exc:
                dl = dead_letter(rec, exc, exc.reason, now_ms)
                out.records.append((TOPICS.dlq.base, dl["original_key"], self._dlq.encode(dl)))
                out.dead[exc.reason] += 1
                continue
            ep, conv = d["endpoint_id"], d["conversion"]
            t = self._scope(ep, get)
            pay = conv["payout_usd_micros"]
            micros = (pay if type(pay) is int and 0 <= pay <= MAX_PAYOUT_MICROS
                      else payout_input(pay))
            at = conv["occurred_at"]
            if not MIN_OCCURRED_AT_MS <= at <= now_ms + MAX_AHEAD_MS:
                micros = event_time_input(micros, at, now_ms)
            at = counted_at(at, rec.written_ms, now_ms)  # (never far ahead of its writing)
            th, fresh = cfg.thresholds(ep), rec.offset > t.offset
            peak = None if type(micros) is not int else (
                judge(t.peaks, at, micros, th.single_multiple, th.floor_micros) if fresh
                else verdict(t.peaks, rec.offset))  # read again: its first verdict
            if fresh:  # not counted in the endpoint's state yet
                st, pk = t.state, t.peaks
                if type(micros) is int:
                    learn = not halts or (GLOBAL_SCOPE not in halts  # halted: not learnt
                                          and (SCOPE, ep) not in halts)
                    st = rolling_add(st, at, micros, learn=learn)
                    pk = pk if peak is None else with_verdict(pk, rec.offset, peak)
                self.scopes[ep] = t = dataclasses.replace(t, state=st, offset=rec.offset,
                                                          peaks=pk)
                touched[ep] = rec.partition
            # The partition's partial has an offset of its own: a kill -9 can land one of
            # the endpoint's state write and the partial's; each counts what it misses.
            retro = retrodated(conv["source_created_at"], conv["source_completed_at"],
                               cfg.window_ms(ep))
            part, p_off = self._partial(rec.partition, get)
            if rec.offset > p_off:
                if type(micros) is int:  # retrodated ones counted for the global burst
                    moved = accumulate(part, at, micros, self.window_ms, retro is True)
                    if part.window_start not in (None, moved.window_start):
                        # the partition's window closed mid-batch: its final partial
                        out.partials.append((rec.partition, part, p_off))
                    part = moved
                self.partials[rec.partition] = (part, rec.offset)
                parts.add(rec.partition)
            modes = cfg.modes(ep)
            ep_rate: RateResult | MissingInputs = NO_BASELINE
            scored: RollingResult | None = None
            if isinstance(micros, MissingInputs):
                ep_rate = micros
            elif modes.endpoint_rate is not Mode.OFF:
                if ((SCOPE, ep) in halts) is not t.halted:
                    t = self._rearm(ep, t, not t.halted)
                    touched[ep] = rec.partition
                scored = self.scores[ep] = evaluate(t.state, th, now_ms=at,
                                                    since_minute=t.since)
                ep_rate = as_rate_result(scored)
            # A payout that cannot be counted cannot be judged globally either: held under
            # the global enforce, naming the field.
            decision = decide(ep, modes, retro, ep_rate,
                              micros if isinstance(micros, MissingInputs) else None, halts,
                              outlier=peak is not None)
            if decision.metrics:
                count_signals(decision.metrics)
            d["enqueued_at"] = now_ms
            if isinstance(decision, Hold):
                if decision.trips:
                    for trip in decision.trips:
                        if trip.scope == SCOPE:  # halted from here on: a close re-arms it
                            if isinstance(scored, RollingOver):
                                trip = dataclasses.replace(trip, detail=describe(scored))
                            self.scopes[ep] = t = dataclasses.replace(t, halted=True)
                            touched[ep] = rec.partition
                        self.halts.trip_now(trip, now_ms)
                        out.trips.append(trip)
                    halts = self.halts.halts
                if decision.reason is HoldReason.PAYOUT_OUTLIER:
                    decision = dataclasses.replace(decision, detail=describe_outlier(
                        micros, peak, th.single_multiple))  # type: ignore[arg-type]
                d["hold_reason"] = decision.reason.value
                out.records.append((TOPICS.held.base, rec.key, self._delivery.encode(d)))
                o = make_outcome(d, "held", now_ms=now_ms, reason=decision.describe())
                out.records.append((TOPICS.outcomes.base, rec.key, self._outcome.encode(o)))
                out.held += 1
            else:
                out.records.append((TOPICS.dispatch.base, rec.key, self._delivery.encode(d)))
                out.dispatched += 1
                if fresh and peak is None and type(micros) is int:  # sent: the peak learns
                    pk = note(t.peaks, at, micros)
                    if pk is not t.peaks:
                        self.scopes[ep] = t = dataclasses.replace(t, peaks=pk)
        self._dirty_eps.update(touched)
        self._dirty_parts |= parts
        self._unsent_parts |= parts
        if now_ms - self._partials_sent_ms >= self.partials_interval_ms:
            out.partials.extend(self.take_partials(now_ms))
        if out.dispatched:
            child(GATE_DECISIONS, "dispatch").inc(out.dispatched)
        if out.held:
            child(GATE_DECISIONS, "held").inc(out.held)
        if out.redelivered:
            child(GATE_DECISIONS, "redelivered_skipped").inc(out.redelivered)
        return out

    def take_partials(self, now_ms: int) -> list[tuple[int, PartitionPartial, int]]:
        """The open-window partials that moved since last sent: (partition, partial, offset).

        Partials are cumulative, so the aggregator loses nothing when intermediate ones are
        skipped: :meth:`process` sends them at most every ``partials_interval_ms`` (a
        window's final partial always at once), and the runner takes the rest before every
        commit and rebalance -- a committed delivery's payout is always on its way to the
        aggregator. At a few deliveries per batch this keeps the aggregator from reading
        as many partials as the gate reads deliveries.
        """
        out = []
        for p in sorted(self._unsent_parts):
            got = self.partials.get(p)
            if got is not None and got[0].window_start is not None:
                out.append((p, got[0], got[1]))
        self._unsent_parts.clear()
        self._partials_sent_ms = now_ms
        return out

    def take_writes(self) -> list[tuple[int, str, Value]]:
        """Table writes (partition, key, value) for the state changed since the last call.

        The runner calls this before every offset commit (and before a rebalance drops the
        cache): the changelog is written once per scope per commit interval, not per
        delivery, and always before the offsets it covers are committed.
        """
        writes: list[tuple[int, str, Value]] = []
        for ep, p in self._dirty_eps.items():
            t = self.scopes.get(ep)
            if t is None:
                continue
            profile, ring, open_, t = dump(t)
            self.scopes[ep] = t
            if profile is not None:  # in this order: see endpoint_state
                writes.append((p, profile_key(ep), profile))
            if ring is not None:
                writes.append((p, ring_key(ep), ring))
            writes.append((p, open_key(ep), open_))
        for p in self._dirty_parts:
            got = self.partials.get(p)
            if got is not None:
                writes.append((p, partial_key(p), dump_partial(*got)))
        self._dirty_eps.clear()
        self._dirty_parts.clear()
        return writes

    def gauges(self) -> None:
        """Export the spans of every armed endpoint scored since the last call, and drop
        the series of endpoints no longer armed or no longer this instance's: bounded by
        the armed endpoints this instance decides for. The runner calls it per commit."""
        for ep, r in self.scores.items():
            if self.config.modes(ep).endpoint_rate is Mode.OFF:
                continue
            for sc in getattr(r, "scores", ()):
                span = str(sc.span)
                ANOMALY_ENDPOINT_SPAN_OBSERVED.labels(ep, span).set(sc.observed_micros / 1e6)
                ANOMALY_ENDPOINT_SPAN_EXPECTED.labels(ep, span).set(sc.expected_micros / 1e6)
                ANOMALY_ENDPOINT_SPAN_SCORE.labels(ep, span, "value").set(sc.score)
                ANOMALY_ENDPOINT_SPAN_SCORE.labels(ep, span, "count").set(sc.count_score)
            self._gauged.add(ep)
        self.scores.clear()
        for ep in [e for e in self._gauged if e not in self.scopes
                   or self.config.modes(e).endpoint_rate is Mode.OFF]:
            self._gauged.discard(ep)
            for g in (ANOMALY_ENDPOINT_SPAN_OBSERVED, ANOMALY_ENDPOINT_SPAN_EXPECTED,
                      ANOMALY_ENDPOINT_SPAN_SCORE):
                g.remove_by_labels({"endpoint": ep})
