"""PostgreSQL sink: deliveries, attempts, outcomes and dead letters -> tables, exactly once.

Reads ``read_committed`` and stores its consumer offsets in ``sink_offsets`` **in the same
PostgreSQL transaction** as the rows they cover; on (re)assignment it seeks to the offsets
stored there, so a crash at any point neither loses nor doubles a row (inserts are also
idempotent on primary keys). Bulk path: COPY into a temp staging table, then
``INSERT ... ON CONFLICT DO NOTHING``. While PostgreSQL is down the sink rewinds, waits and
retries; Kafka holds the backlog. A record the sink cannot decode is stored as a
dead-letter row (stage ``sink``) with its original bytes.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from postbacks.codec import codec_for
from postbacks.db.connect import connect
from postbacks.db.migrate import ensure_attempt_partitions
from postbacks.errors import DeadLetterError, ServiceUnavailable
from postbacks.ids import new_id
from postbacks.kafka.clients import check_broker, make_consumer, records
from postbacks.metrics import SINK_ROWS, STAGE_RECORDS, observe_backlog
from postbacks.settings import Settings
from postbacks.sinks.tables import STAGING_DDL, TABLES, ts_from_ms
from postbacks.topics import TOPICS

__all__ = ["PostgresSink", "run_sink"]

log = logging.getLogger(__name__)

GROUP = "postbacks-sink"



class PostgresSink:
    """``add()`` decoded rows, ``flush()`` them with the offsets in one transaction."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.group = settings.topic(GROUP)
        self._conn: psycopg.Connection[Any] | None = None
        self._rows: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        self._touched: set[str] = set()
        self._offsets: dict[tuple[str, int], int] = {}
        self._by_topic = {
            settings.topic(TOPICS.deliveries.base): ("Delivery", TABLES["deliveries"]),
            settings.topic(TOPICS.attempts.base): ("Attempt", TABLES["attempts"]),
            settings.topic(TOPICS.outcomes.base): ("Outcome", TABLES["outcomes"]),
            settings.topic(TOPICS.dlq.base): ("DeadLetter", TABLES["dead_letters"]),
        }

    @property
    def topics(self) -> list[str]:
        return list(self._by_topic)

    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.settings.database_url)
            self._conn.execute(STAGING_DDL)
            ensure_attempt_partitions(self._conn, dt.datetime.now(dt.UTC).date())
            self._conn.commit()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def stored_offsets(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        rows = self.conn().execute(
            "SELECT topic, kafka_partition, next_offset FROM sink_offsets"
            " WHERE consumer_group = %s",
            (self.group,),
        ).fetchall()
        self.conn().commit()
        stored = {(t, p): o for t, p, o in rows}
        return [
            TopicPartition(tp.topic, tp.partition, stored.get((tp.topic, tp.partition),
                                                              OFFSET_BEGINNING))
            for tp in partitions
        ]

    def add(self, msg: Message, now_ms: int) -> None:
        topic = msg.topic() or ""
        record, table = self._by_topic[topic]
        self._offsets[(topic, msg.partition() or 0)] = (msg.offset() or 0) + 1
        try:
            value = codec_for(record).decode(msg.value())
        except DeadLetterError as exc:
            self._rows["dead_letters"].append(self._undecodable(msg, exc, now_ms))
            return
        self._rows[table.name].append(table.row(value))
        if table.touches_delivery:
            self._touched.add(value["delivery_id"])

    def _undecodable(self, msg: Message, exc: DeadLetterError, now_ms: int) -> tuple[Any, ...]:
        return (
            new_id("dlq", now_ms), exc.reason, type(exc).__name__, str(exc), "sink",
            msg.topic() or "", msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value(),
            None, None, ts_from_ms(now_ms),
        )

    def pending(self) -> int:
        return len(self._offsets)

    def flush(self) -> dict[str, int]:
        """Write every added row and the offsets in one transaction; returns rows per table."""
        written: dict[str, int] = {}
        conn = self.conn()
        try:
            with conn.transaction():
                for name in ("deliveries", "attempts", "outcomes", "dead_letters"):
                    rows = self._rows.get(name)
                    if rows:
                        written[name] = TABLES[name].write(conn, rows)
                if self._touched:
                    _project_status(conn, sorted(self._touched))
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO sink_offsets (consumer_group, topic, kafka_partition,"
                        " next_offset) VALUES (%s, %s, %s, %s) ON CONFLICT (consumer_group,"
                        " topic, kafka_partition) DO UPDATE SET next_offset ="
                        " EXCLUDED.next_offset, updated_at = now()",
                        [(self.group, t, p, o) for (t, p), o in self._offsets.items()],
                    )
        finally:
            self._rows.clear()
            self._touched.clear()
        self._offsets.clear()
        for name, n in written.items():
            SINK_ROWS.labels(table=name).inc(n)
        return written

    def discard(self) -> None:
        self._rows.clear()
        self._touched.clear()
        self._offsets.clear()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def _project_status(conn: psycopg.Connection[Any], delivery_ids: list[str]) -> None:
    """Re-derive the status projection of the touched deliveries from outcomes and attempts:
    status = the latest outcome's kind; held_at/hold_reason from the latest ``held``
    outcome; ``suppressed`` outcomes (permanent mapping failures) become
    postback_suppressions rows."""
    conn.execute(
        "UPDATE deliveries d SET status = o.kind, status_at = o.occurred_at"
        " FROM (SELECT DISTINCT ON (delivery_id) delivery_id, kind, occurred_at"
        "       FROM delivery_outcomes WHERE delivery_id = ANY(%(ids)s)"
        "       ORDER BY delivery_id, occurred_at DESC, outcome_id DESC) o"
        " WHERE d.delivery_id = o.delivery_id",
        {"ids": delivery_ids},
    )
    conn.execute(
        "UPDATE deliveries d SET held_at = o.occurred_at, hold_reason = o.reason"
        " FROM (SELECT DISTINCT ON (delivery_id) delivery_id, occurred_at, reason"
        "       FROM delivery_outcomes WHERE delivery_id = ANY(%(ids)s) AND kind = 'held'"
        "       ORDER BY delivery_id, occurred_at DESC, outcome_id DESC) o"
        " WHERE d.delivery_id = o.delivery_id AND d.status = 'held'",
        {"ids": delivery_ids},
    )
    conn.execute(
        "INSERT INTO postback_suppressions (delivery_id, endpoint_id, reason, created_at)"
        " SELECT DISTINCT ON (delivery_id) delivery_id, endpoint_id, coalesce(reason, ''),"
        " occurred_at FROM delivery_outcomes WHERE delivery_id = ANY(%(ids)s)"
        " AND kind = 'suppressed' ORDER BY delivery_id, occurred_at"
        " ON CONFLICT (delivery_id) DO NOTHING",
        {"ids": delivery_ids},
    )
    conn.execute(
        "UPDATE deliveries d SET attempt_count = a.n, last_error = a.err"
        " FROM (SELECT DISTINCT ON (delivery_id) delivery_id, attempt_no AS n,"
        "       error_class AS err FROM delivery_attempts WHERE delivery_id = ANY(%(ids)s)"
        "       ORDER BY delivery_id, attempt_no DESC, attempted_at DESC) a"
        " WHERE d.delivery_id = a.delivery_id AND d.attempt_count <= a.n",
        {"ids": delivery_ids},
    )


def run_sink(settings: Settings, stop: threading.Event, *, retry_s: float = 2.0) -> None:
    check_broker(settings)
    sink = PostgresSink(settings)
    sink.conn()  # fail fast with a clear message when PostgreSQL is missing

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        while not stop.is_set():
            try:
                consumer.assign(sink.stored_offsets(partitions))
                return
            except (psycopg.Error, OSError, ServiceUnavailable) as exc:
                log.warning("sink: PostgreSQL unavailable during assignment (%s); retrying", exc)
                sink.discard()
                time.sleep(retry_s)

    # Rows may land a fraction of a second later; in exchange the broker answers a few
    # large fetches a second instead of one per produce batch (fetches, not bytes, are
    # what a busy local broker spends its CPU on).
    consumer = make_consumer(settings, GROUP, **{"fetch.min.bytes": 262_144,
                                                  "fetch.wait.max.ms": 200})
    consumer.subscribe(sink.topics, on_assign=on_assign)
    processed = STAGE_RECORDS.labels(stage="sink")
    try:
        while not stop.is_set():
            msgs = consumer.consume(settings.batch_size * 4, timeout=0.5)
            now_ms = int(time.time() * 1000)
            for m in records(msgs, "sink"):
                observe_backlog(m, now_ms)
                sink.add(m, now_ms)
            if not sink.pending():
                continue
            try:
                sink.flush()
                processed.inc(len(msgs))
            except (psycopg.OperationalError, psycopg.InterfaceError, OSError,
                    ServiceUnavailable) as exc:
                log.warning("sink: PostgreSQL write failed (%s); rewinding and retrying", exc)
                sink.discard()
                _rewind_to_stored(consumer, sink, stop, retry_s)
    finally:
        consumer.close()
        sink.close()


def _rewind_to_stored(
    consumer: Consumer, sink: PostgresSink, stop: threading.Event, retry_s: float
) -> None:
    while not stop.is_set():
        time.sleep(retry_s)
        try:
            for tp in sink.stored_offsets(consumer.assignment()):
                consumer.seek(tp)
            log.info("sink: PostgreSQL is back; resumed from stored offsets")
            return
        except (psycopg.Error, OSError, ServiceUnavailable) as exc:
            log.warning("sink: still waiting for PostgreSQL: %s", exc)
            sink.discard()
        except KafkaException as exc:  # seek on a partition not yet fetching
            log.warning("sink: seek failed (%s); reassigning", exc)
            consumer.assign(sink.stored_offsets(consumer.assignment()))
            return

