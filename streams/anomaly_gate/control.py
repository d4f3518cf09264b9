"""Halts across instances: the control-topic reader, trip broadcast and durable trip records.

- :class:`ControlReader`: every gate instance reads all of ``anomaly.control.v1`` with a
  group-less consumer (a Faust GlobalTable does not see live updates in faust-streaming
  0.15: docs/decisions/0004-faust-gate.md) and merges each state into the
  :class:`HaltBook`. It reads to the end before the gate processes anything.
- :func:`breaker_state`: the BreakerState record of a trip (the runner produces it in the
  same flush as the batch that tripped, so a trip is on the topic before its batch counts
  as done).
- :class:`TripWriter`: persists trips in PostgreSQL (``payout_anomaly_settings.state``,
  audited), retrying until it succeeds; a trip seen on the topic that PostgreSQL does not
  have yet (its writer died) is written by whoever sees it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from postbacks.codec import codec_for
from postbacks.core.anomaly import Detector, HaltState, Trip
from postbacks.core.anomaly.halts import (
    CONTROL_AHEAD_MS,
    StartRefusals,
    read_change,
    refusal,
    refused,
)
from postbacks.errors import DeadLetterError
from postbacks.metrics import ANOMALY_TRIPS, CONTROL_REFUSED, child
from postbacks.records import BreakerStateRecord
from postbacks.settings import Settings
from streams.anomaly_gate.admin import breaker_record, control_key
from streams.anomaly_gate.config import HaltBook, core_scope
from streams.anomaly_gate.refresh import gauge_halts
from topics import TOPICS

__all__ = ["MAX_AHEAD_MS", "ControlReader", "TripWriter", "breaker_state", "refused"]

log = logging.getLogger(__name__)


def breaker_state(trip: Trip, global_key: str, now_ms: int) -> tuple[bytes, BreakerStateRecord]:
    """(key, record) announcing a trip on the control topic (the same record and key
    ``postbacks anomaly close`` publishes for a close)."""
    key = global_key if trip.scope == "global" else trip.key
    rec = breaker_record({
        "scope": trip.scope, "scope_key": key, "detector": trip.detector.value,
        "state": HaltState.TRIPPED.value, "changed_at": now_ms,
        "reason": (f"retrodated burst: {trip.observed} retrodated deliveries against "
                   f"{trip.baseline:.1f} usual" if trip.detector is Detector.RETRODATING
                   else f"payout {trip.observed / 1e6:.2f} USD over baseline "
                   f"{trip.baseline / 1e6:.2f}")
                  + f" in window {trip.window_start_ms}"
                  + ("" if trip.detail is None else f" ({trip.detail})"),
    }, observed=float(trip.observed), baseline=float(trip.baseline))
    return control_key(trip.scope, key, trip.detector.value), rec


MAX_AHEAD_MS = CONTROL_AHEAD_MS  # a change dated further ahead of a gate's clock: refused


class ControlReader:
    def __init__(self, settings: Settings, halts: HaltBook, writer: TripWriter) -> None:
        self.settings = settings
        self.halts = halts
        self.writer = writer
        self.topic = settings.topic(TOPICS.anomaly_control.base)
        self._codec = codec_for("BreakerState")
        self._consumer: AIOKafkaConsumer | None = None
        self.seen = 0
        # counted once: while start() reads the topic from its beginning, only those still
        # their key's latest change (one fixed since awaits compaction)
        self._refusals: StartRefusals[bytes | None] = StartRefusals()

    async def start(self) -> None:
        """Assign every partition, read from the beginning up to the current end."""
        c = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap_servers,
                             client_id="postbacks-gate-control",
                             group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", isolation_level="read_committed")
        await c.start()
        self._consumer = c
        parts = c.partitions_for_topic(self.topic) or {0}
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        end = await c.end_offsets(tps)
        self._refusals.begin()
        while True:
            behind = [tp for tp in tps if await c.position(tp) < end[tp]]
            if not behind:
                break
            await self._poll(500)
        for reason in self._refusals.end():
            child(CONTROL_REFUSED, reason).inc()
        tripped = self.halts.tripped()
        log.info("control topic read: %d state(s); %d scope(s) tripped%s", self.seen,
                 len(tripped), f" (global: {self.settings.anomaly_global_key})"
                 if ("global", "*") in tripped else "")
        gauge_halts(self.halts)

    async def _poll(self, timeout_ms: int) -> None:
        assert self._consumer is not None
        got = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=1000)
        for msgs in got.values():
            for m in msgs:
                self._apply(m.value, m.key)

    def _apply(self, raw: bytes | None, key: bytes | None = None) -> None:
        self._refusals.replaced(key)
        if raw is None:
            return  # a compaction tombstone: nothing to honour
        try:
            rec: BreakerStateRecord = self._codec.decode(raw)  # type: ignore[assignment]
            change = read_change(rec, self.settings.anomaly_global_key,
                                 int(time.time() * 1000))
        except (DeadLetterError, ValueError) as exc:
            log.error("control topic: unreadable state ignored: %s", exc)
            return
        if change is None:
            return  # another deployment's global scope
        if isinstance(change, str):  # "latest change wins": one dated ahead would win for ever
            log.error("%s", refusal(rec, change))
            for reason in self._refusals.refused(key, change):
                child(CONTROL_REFUSED, reason).inc()
            return
        self.seen += 1
        if self.halts.apply(change):
            log.warning("halt %s/%s %s is now %s (%s)", rec["scope"], rec["scope_key"],
                        rec["detector"], change.state.value, rec["actor"] or rec["reason"] or "")
        gauge_halts(self.halts)  # also when this gate tripped it: its own record changes nothing
        if change.state is HaltState.TRIPPED:
            self.writer.ensure(rec)

    async def run(self) -> None:
        while True:
            try:
                await self._poll(200)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("control topic read failed; retrying")
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()


class TripWriter:
    """Persist trips in PostgreSQL (audited), retrying; idempotent per trip."""

    def __init__(self, settings: Settings, halts: HaltBook) -> None:
        self.settings = settings
        self.halts = halts
        self._pending: dict[bytes, BreakerStateRecord] = {}
        self._wake = asyncio.Event()

    def trip(self, trip: Trip, now_ms: int) -> tuple[bytes, BreakerStateRecord]:
        key, rec = breaker_state(trip, self.settings.anomaly_global_key, now_ms)
        ANOMALY_TRIPS.labels(trip.scope, trip.detector.value).inc()
        log.warning("TRIP %s/%s %s: %s", rec["scope"], rec["scope_key"], rec["detector"],
                    rec["reason"])
        self.ensure(rec)
        gauge_halts(self.halts)  # the scope was tripped here (trip_now) just before
        return key, rec

    def ensure(self, rec: BreakerStateRecord) -> None:
        key = control_key(rec["scope"], rec["scope_key"], rec["detector"])
        cur = self._pending.get(key)
        if cur is None or cur["changed_at"] < rec["changed_at"]:
            self._pending[key] = rec
            self._wake.set()

    def _write(self, rec: BreakerStateRecord) -> bool:
        from postbacks.db.anomaly import record_trip
        from postbacks.db.connect import connect

        with connect(self.settings.database_url) as conn:
            return record_trip(
                conn, scope=rec["scope"], scope_key=rec["scope_key"],
                detector=rec["detector"] or Detector.VALUE_RATE.value,
                reason=rec["reason"] or "", observed=rec["observed_value"],
                baseline=rec["baseline_value"], at_ms=rec["changed_at"],
            )

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for key, rec in list(self._pending.items()):
                if not self._current(rec):  # a newer state (a human's close) superseded it
                    del self._pending[key]
                    continue
                try:
                    changed = await asyncio.to_thread(self._write, rec)
                except Exception as exc:  # PostgreSQL down: the topic holds the trip meanwhile
                    log.error("recording trip %s in PostgreSQL failed (%s); retrying", key, exc)
                    await asyncio.sleep(2.0)
                    self._wake.set()
                    continue
                if self._pending.get(key) is rec:
                    del self._pending[key]
                if changed:
                    log.info("trip %s recorded in PostgreSQL", key.decode())

    def _current(self, rec: BreakerStateRecord) -> bool:
        scope = core_scope(rec["scope"], rec["scope_key"], self.settings.anomaly_global_key)
        if scope is None:
            return False
        latest = self.halts.latest(scope, rec["detector"])
        return (latest is not None and latest.state is HaltState.TRIPPED
                and latest.changed_at == rec["changed_at"])

    @property
    def pending(self) -> int:
        return len(self._pending)
