"""The anomaly gate process: a Faust app (agents, tables, changelog recovery, rebalancing)
around the synchronous :class:`GateEngine` and :class:`GlobalAggregator`.

Processing guarantee (measured against the broker, docs/decisions/0004-faust-gate.md):
Faust's exactly_once is unusable in faust-streaming 0.15, so the gate is **at-least-once
with effectively-once state**:

- a batch's outputs and partials, then the table writes for its state (through one
  idempotent, acks=all confluent-kafka producer, to the tables' Faust changelog topics in
  Faust's own JSON encoding, so Faust recovers the tables as usual), are acknowledged by
  the broker before Faust commits the offsets covering them: nothing is lost;
- after a crash the uncommitted tail is decided again; its records are duplicates that the
  agent (same idempotency key) and the sink (primary keys) absorb, and its payouts are not
  counted twice (offsets persisted with the state);
- a failed produce or changelog write restarts the process in place before Faust can
  commit anything past it; SIGTERM finishes the batch in flight, commits, and exits.

Latency (bench/gate.py, measured): the changelog writes used to go through Faust's
``send_changelog`` -- one Faust/aiokafka send (futures, callbacks, serialisation) per
changed scope on the agents' event loop, about 300 per commit at 2,000 deliveries/s over
300 endpoints. That burst and the wait for its futures stalled the agents every commit
interval (a commit took 30-70 ms; p99 added latency 116-182 ms against a p50 of 20 ms).
Produced through the confluent producer (C, its own thread) the same writes cost a few
ms. A full (generation 2) garbage collection over Faust's and the libraries' start-up
objects took up to 90 ms; they are frozen after start-up (``gc.freeze``), so a full
collection only walks what the gate allocated since.

Transactional input is read committed (``faust_patches.patch_faust_read_committed``:
Faust reads uncommitted records unless it runs its own exactly_once). Faust's fetch loop
hands records to the streams without four tasks per record
(``faust_patches.patch_faust_eager_deliver``), and never hands over a record fetched
before a rebalance's seek after it (``faust_patches.patch_faust_seek_fence``: such a
batch's first record made the offsets before it a gap that was committed unprocessed).

Offset commits over transactional input (faust-streaming 0.15 bug, patched in
``faust_patches``): a
transaction marker leaves a gap in the offsets the gate reads (fan-out writes
``deliveries.v1`` in transactions). Faust records the gap after read offset ``r`` up to
the next record ``o`` as ``[r + 1, o]`` -- ``o`` included, though ``o`` is acked too -- and
the duplicate ``o`` in its acked list ends the run of consecutive offsets it commits up
to. Each commit then advanced one transaction per partition: behind fan-out at 2,000/s
the committed offset fell ~1,000 records further behind every second (measured), and a
restart would have decided all of them again. ``faust_patches.patch_faust_gaps`` records
the gap as ``[r + 1, o - 1]``; ``tests/e2e/test_anomaly_gate.py`` checks the commits keep up.
Upstream: faust-streaming/faust#606, robinhood/faust#625.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from typing import Any

import faust
from confluent_kafka import KafkaError, Message, Producer
from faust.serializers import codecs as faust_codecs

from postbacks.codec import codec_for
from postbacks.core.anomaly import PartitionPartial
from postbacks.kafka.clients import make_producer
from postbacks.kafka.watchdog import restart_in_place
from postbacks.loopwatch import LoopWatch
from postbacks.metrics import DLQ_TOTAL, GATE_BATCH_SECONDS, GC_FROZEN, STAGE_RECORDS, child
from postbacks.records import PayoutPartialRecord
from postbacks.settings import Settings
from streams.anomaly_gate.aggregate import PARTIAL_WINDOW_MS, GlobalAggregator, owns
from streams.anomaly_gate.config import HaltBook
from streams.anomaly_gate.control import ControlReader, TripWriter
from streams.anomaly_gate.engine import BatchOut, GateEngine, In
from streams.anomaly_gate.faust_patches import (
    patch_faust_eager_deliver,
    patch_faust_gaps,
    patch_faust_read_committed,
    patch_faust_seek_fence,
)
from streams.anomaly_gate.refresh import Refresher
from streams.anomaly_gate.stall import ProgressWatch, check_expired_at_start
from streams.anomaly_gate.startup import faust_settings, prepare
from streams.anomaly_gate.state_writes import HeldWrites, Write
from topics import GATE_APP, TOPICS

__all__ = ["GateProcess"]

log = logging.getLogger("postbacks.gate")

GROUP = GATE_APP  # the Faust app id: its consumer group, prefixed like a topic
# The tables; Faust names their changelogs "<app id>-<table>-changelog", which the registry
# holds (TOPICS.gate_endpoints_changelog, TOPICS.gate_global_changelog).
EP_TABLE, G_TABLE = "gate-endpoints", "gate-global"


patch_faust_gaps()
patch_faust_read_committed()
patch_faust_eager_deliver()
patch_faust_seek_fence()
# The tables' changelog serializer (Faust's "json" codec for keys and values): records
# produced with it are read back by Faust's table recovery exactly like its own.
_CHANGELOG_CODEC = faust_codecs.get_codec("json")


class GateProcess:
    def __init__(self, settings: Settings, refresher: Refresher) -> None:
        self.settings = settings
        self.halts = HaltBook()
        self.refresher = refresher
        cfg = refresher.apply_initial(self.halts)
        self.engine = GateEngine(
            cfg, self.halts, window_ms=PARTIAL_WINDOW_MS,
            partials_interval_ms=int(settings.gate_partials_interval_s * 1000),
            partitions=TOPICS.deliveries.partitions)  # as its tables' changelogs
        self.aggregator = GlobalAggregator(cfg, self.halts, settings.anomaly_global_key)
        refresher.targets = (self.engine, self.aggregator)
        self.writer = TripWriter(settings, self.halts)
        self.control = ControlReader(settings, self.halts, self.writer)
        self.producer: Producer = make_producer(settings, **{"linger.ms": settings.gate_linger_ms,
                                                            "client.id": "postbacks-gate"})
        self._failed: list[str] = []
        self._held = HeldWrites()
        self._produced = 0  # records handed to the producer ...
        self._reported = 0  # ... and delivery reports received for them
        self._partial_codec = codec_for("PayoutPartial")
        self._control_codec = codec_for("BreakerState")
        self.busy = False
        self.idle = asyncio.Event()
        self.idle.set()
        self.stopping = False
        self._aggregating: bool | None = None
        self._tick = time.monotonic()  # the event loop's last turn (the progress watch)
        self.app = self._build_app()

    # ----------------------------------------------------------------- Faust app
    def _build_app(self) -> faust.App:
        s = self.settings
        app = faust.App(s.topic(GROUP), **faust_settings(s))

        def raw_topic(name: str) -> Any:
            return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                             value_serializer="raw")

        src = raw_topic(s.topic(TOPICS.deliveries.base))
        partials = raw_topic(s.topic(TOPICS.anomaly_partials.base))
        ep_table = app.Table(EP_TABLE, default=None,
                             partitions=TOPICS.gate_endpoints_changelog.partitions)
        g_table = app.Table(G_TABLE, default=None,
                            partitions=TOPICS.gate_global_changelog.partitions)

        async def gate(stream: Any) -> None:
            async for events in stream.take_events(s.gate_batch_max, s.gate_batch_within_s):
                await self._guarded(self._gate_batch, events, ep_table)

        async def aggregate(stream: Any) -> None:
            async for events in stream.take_events(1000, 0.02):
                await self._guarded(self._aggregate_batch, events, g_table)

        app.agent(src, name="gate")(gate)
        app.agent(partials, name="aggregate")(aggregate)

        self._tables = (ep_table, g_table)

        def forget(*_a: Any, **_k: Any) -> None:
            self._send_partials(self.engine.take_partials(int(time.time() * 1000)))
            self._hold_states()  # nothing counted is dropped with the cache
            self.producer.flush(10)  # the partials before the state that counts them
            self._produce_states(None)
            self.engine.forget()
            self.aggregator.forget()

        def assigned(*args: Any, **_k: Any) -> None:  # (app, the assigned partitions)
            tps = args[1] if len(args) > 1 else ()
            forget()
            self._aggregating = owns(tps, partials.get_topic_name(), self._aggregating)

        app.on_partitions_revoked.connect(forget)
        app.on_partitions_assigned.connect(assigned)
        faust_flush = app.producer.flush

        async def flush_all() -> None:  # Faust calls this before it commits offsets
            await faust_flush()
            await self.flush()

        app.producer.flush = flush_all  # type: ignore[method-assign]
        return app

    async def _guarded(self, fn: Any, events: Any, table: Any) -> None:
        """Run one batch; any failure restarts the process before Faust can commit it."""
        if self.stopping:
            await asyncio.Event().wait()  # never processed, never acknowledged: re-read
        self.busy = True
        self.idle.clear()
        try:
            await fn(events, table)
        except asyncio.CancelledError:
            restart_in_place("gate: batch cancelled mid-flight")
        except Exception as exc:
            log.exception("gate batch failed")
            restart_in_place(f"gate: batch failed: {exc!r}", backoff_s=1.0)
        finally:
            self.busy = False
            self.idle.set()

    # ----------------------------------------------------------------- batches
    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        self._reported += 1
        if err is not None:
            self._failed.append(str(err))

    def _produce(self, topic_base: str, key: bytes | None, value: bytes) -> None:
        self._send(self.settings.topic(topic_base), key, value)

    def _send(self, topic: str, key: bytes | None, value: bytes, partition: int = -1) -> None:
        """Hand one record to the producer (partition -1: by key); its delivery report is
        counted in ``flush``."""
        while True:
            try:
                self.producer.produce(topic, value, key, partition=partition,
                                      on_delivery=self._on_delivery)
                self._produced += 1
                return
            except BufferError:
                self.producer.poll(0.05)

    async def flush(self) -> None:
        """Everything produced so far is acknowledged, or the process restarts.

        Runs before every Faust offset commit (``app.producer.flush`` is wrapped): Faust
        picks the offsets first, the state taken here covers every batch processed so far
        (batches are pipelined: one returns once its records are handed to the producer),
        and it is produced once the outputs and partials before it are acknowledged
        (:mod:`streams.anomaly_gate.state_writes` says why)."""
        self._send_partials(self.engine.take_partials(int(time.time() * 1000)))
        ticket = self._hold_states()
        await self._acknowledged()
        self._produce_states(ticket)
        await self._acknowledged()

    async def _acknowledged(self) -> None:
        """The reports of what was produced *before* now (producer.flush() would wait for
        a moment the queue is empty: under steady load, long)."""
        target, deadline = self._produced, time.monotonic() + 60.0
        while self._reported < target and time.monotonic() < deadline:
            self.producer.poll(0)
            await asyncio.sleep(0.002)
        left = max(0, target - self._reported)
        if left or self._failed:
            restart_in_place(f"gate: {left} record(s) unacknowledged, failed: "
                             f"{self._failed[:3]} (nothing committed past them)", backoff_s=1.0)

    def _hold_states(self) -> int:
        """Changed states -> tables (once a commit); their changelog records are held."""
        ep_table, g_table = self._tables
        self.engine.gauges()
        writes = [Write(ep_table, p, k, v) for p, k, v in self.engine.take_writes()]
        writes += [Write(g_table, 0, k, v) for k, v in self.aggregator.take_writes()]
        for w in writes:
            w.table.data[w.key] = w.value  # the cache a rebalance restores from: now
        return self._held.hold(writes)

    def _produce_states(self, upto: int | None) -> None:
        """The held changelog records, as Faust's ``send_changelog`` would write them, but
        through the confluent producer (acknowledged like the outputs)."""
        for w in self._held.release(upto):
            self._send(w.table.changelog_topic.get_topic_name(), _CHANGELOG_CODEC.dumps(w.key),
                       _CHANGELOG_CODEC.dumps(w.value), w.partition)

    async def _gate_batch(self, events: Any, table: Any) -> None:
        t0 = time.perf_counter()
        now_ms = int(time.time() * 1000)
        batch = [In(e.message.topic, e.message.partition, e.message.offset, e.message.key,
                    e.message.value, int((e.message.timestamp or 0) * 1000)) for e in events]
        out: BatchOut = self.engine.process(batch, table.data.get, now_ms)
        for topic, key, value in out.records:
            self._produce(topic, key, value)
        for reason, n in out.dead.items():  # produced (the gate's outputs are not transactional)
            DLQ_TOTAL.labels(stage="gate", reason=reason).inc(n)
        self._send_partials(out.partials)
        for trip in out.trips:
            key, state = self.writer.trip(trip, self.halts.tripped_at(trip, now_ms))
            self._produce(TOPICS.anomaly_control.base, key, self._control_codec.encode(state))
        if out.trips:
            await self.flush()  # a trip is on the control topic before its batch is done
        self.producer.poll(0)  # serve delivery reports
        child(STAGE_RECORDS, "gate").inc(len(batch))
        GATE_BATCH_SECONDS.observe(time.perf_counter() - t0)

    def _send_partials(self, partials: list[tuple[int, PartitionPartial, int]]) -> None:
        now_ms = int(time.time() * 1000)
        for partition, part, off in partials:
            rec = PayoutPartialRecord(partition=partition, window_start=part.window_start or 0,
                                      total_micros=part.total, count=part.count,
                                      retrodated=part.retro,
                                      source_offset=off,
                                      produced_at=now_ms)
            self._produce(TOPICS.anomaly_partials.base, str(partition).encode(),
                          self._partial_codec.encode(rec))

    async def _aggregate_batch(self, events: Any, table: Any) -> None:
        now_ms = int(time.time() * 1000)
        batch = [(e.message.offset, e.message.value) for e in events]
        trips = self.aggregator.process(batch, table.data.get, now_ms)
        for trip in trips:
            key, state = self.writer.trip(trip, self.halts.tripped_at(trip, now_ms))
            self._produce(TOPICS.anomaly_control.base, key, self._control_codec.encode(state))
        if trips:
            await self.flush()  # a trip is on the control topic before anything else

    # ----------------------------------------------------------------- lifecycle
    async def run(self, stop: threading.Event) -> None:
        os.makedirs(self.app.conf.datadir, exist_ok=True)
        await asyncio.to_thread(prepare, self.settings)  # changelogs, coordinator (startup.py)
        await asyncio.to_thread(check_expired_at_start, self.settings, self.app.conf.id)
        await self.control.start()
        tasks = [asyncio.create_task(t) for t in
                 (self.control.run(), self.writer.run(), self.refresher.run(self.halts))]
        await self.app.start()
        tasks.append(asyncio.create_task(self._commit_loop(stop)))
        gc.freeze()  # start-up objects out of the collector's way (see the module docstring)
        GC_FROZEN.set(gc.get_freeze_count())
        log.info("gate running (instance %s)", self.settings.instance_id)
        watch = LoopWatch("gate")  # the event loop's lag and who holds it (postbacks/loopwatch)
        watch.start()
        self._tick = time.monotonic()
        threading.Thread(target=self._watch_progress, args=(stop,), name="gate-progress",
                         daemon=True).start()
        while not stop.is_set():
            await asyncio.sleep(0.1)
            self._tick = time.monotonic()
            crashed = [svc for svc in (self.app, self.app.consumer,
                                       getattr(self.app, "_fetcher", None))
                       if svc is not None and svc.crashed]
            if crashed:  # a crashed Faust service would otherwise stall the partitions
                restart_in_place(f"gate: Faust {crashed[0]!r} crashed: "
                                 f"{crashed[0].crash_reason!r}", backoff_s=2.0)
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    restart_in_place(f"gate: background task failed: {t.exception()!r}")
        watch.stop()
        await self.shutdown()

    async def _commit_loop(self, stop: threading.Event) -> None:
        """Offsets (after :meth:`flush`) every ``gate_commit_interval_s`` *after* the previous
        commit ended: Faust's own timer starts the next one on schedule and, when a commit
        under a backlog takes longer than the interval, runs late and warns (startup.py)."""
        while not stop.is_set() and not self.stopping:
            await asyncio.sleep(self.settings.gate_commit_interval_s)
            if not self.stopping:
                await self.app.consumer.commit()

    def _watch_progress(self, stop: threading.Event) -> None:
        """On a thread of its own, so that neither a blocked event loop nor a hung check
        keeps it from firing: a partition whose committed offset stands still with records
        waiting (:class:`ProgressWatch`), or an event loop that has not turned for
        ``stall_restart_s``, restarts the process in place -- with every thread's stack in
        the log, so the stall can be read afterwards."""
        watch = ProgressWatch(self.settings, self.app.conf.id, self.settings.stall_restart_s)
        while not stop.wait(5.0):
            lag = time.monotonic() - self._tick
            if lag > self.settings.stall_restart_s:
                restart_in_place(f"gate: the event loop has not turned for {lag:.0f} s",
                                 dump=True, backoff_s=1.0)
            stuck = watch.stalled()
            if stuck and not stop.is_set():
                restart_in_place(f"gate: no progress: {stuck}", dump=True, backoff_s=1.0)

    async def shutdown(self) -> None:
        """Finish the batch in flight, commit what is done, leave (nothing half-acknowledged:
        a graceful Faust stop would acknowledge a cancelled batch)."""
        self.stopping = True
        try:
            await asyncio.wait_for(self.idle.wait(), 30)
        except TimeoutError:
            log.warning("batch in flight did not finish within 30 s; leaving it unacknowledged")
        try:
            await asyncio.wait_for(self.app.consumer.commit(), 10)
        except Exception as exc:  # the next owner re-reads from the last commit
            log.warning("final commit failed: %r", exc)
        self.producer.flush(10)
        log.info("gate stopped")
        logging.shutdown()
        os._exit(0)
