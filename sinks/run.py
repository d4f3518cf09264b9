"""The sink's process: a consumer of the delivery topics (read committed, eager range
assignment) feeding :class:`~sinks.postgres.PostgresSink`, which stores rows and offsets in
one PostgreSQL transaction. While PostgreSQL is down it rewinds to the offsets stored there,
waits and retries; a batch PostgreSQL refuses for a value in it is read again with every row
checked (:mod:`sinks.refusals`), and if it is refused again, once more to be written row by
row (:mod:`sinks.careful`)."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition

from postbacks.errors import ServiceUnavailable
from postbacks.kafka.clients import check_broker, make_consumer, records
from postbacks.kafka.expired import check_expired
from postbacks.kafka.watchdog import guard, subscribe_watched
from postbacks.metrics import SINK_WAITING, STAGE_RECORDS
from postbacks.settings import Settings
from sinks.postgres import GROUP, REFUSALS, PostgresSink

__all__ = ["run_sink"]

log = logging.getLogger("sinks.postgres")


# PostgreSQL unable to take writes for now: down, or read only (a standby after a failover,
# default_transaction_read_only set in a disk emergency): the sink waits, then catches up.
DOWN: tuple[type[BaseException], ...] = (
    psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.ReadOnlySqlTransaction,
    OSError, ServiceUnavailable)


def run_sink(settings: Settings, stop: threading.Event, *, retry_s: float = 2.0) -> None:
    check_broker(settings)
    sink = PostgresSink(settings)
    while not stop.is_set():  # fail fast with a clear message when PostgreSQL is missing
        try:
            sink.conn()
            break
        except psycopg.errors.ReadOnlySqlTransaction as exc:  # there, but takes no writes
            log.warning("sink: PostgreSQL is read only (%s); waiting for it to take writes",
                        str(exc).strip())
            sink.discard()
            time.sleep(retry_s)

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        while not stop.is_set():
            try:
                stored = sink.stored_offsets(partitions)
                check_expired(consumer, settings.topic(GROUP), partitions,
                              {(tp.topic, tp.partition): tp.offset for tp in stored})
                consumer.assign(stored)
                sink.new_rows_from(consumer, partitions)
                log.info("sink: assigned %d partition(s)", len(partitions))
                return
            except (psycopg.Error, OSError, ServiceUnavailable) as exc:
                log.warning("sink: PostgreSQL unavailable during assignment (%s); retrying", exc)
                sink.discard()
                time.sleep(retry_s)

    # Rows may land a fraction of a second later; in exchange the broker answers a few
    # large fetches a second instead of one per produce batch (fetches, not bytes, are
    # what a busy local broker spends its CPU on).
    # Eager range assignment gives one sink the same partitions of every topic (keyed by
    # endpoint, equal counts), which rows written final depend on (WaitingRows), and hands
    # on_assign the whole assignment, which it assigns.
    consumer = make_consumer(settings, GROUP, **{"fetch.min.bytes": 262_144,
                                                  "fetch.wait.max.ms": 200,
                                                  "partition.assignment.strategy": "range"})
    def on_revoke(_consumer: Consumer, partitions: list[TopicPartition]) -> None:
        sink.forget(partitions)  # (eager assignment: every partition goes)

    subscribe_watched(consumer, sink.topics, settings, GROUP, stop, on_assign=on_assign,
                      on_revoke=on_revoke, offsets_in_kafka=False)  # in PostgreSQL
    processed = STAGE_RECORDS.labels(stage="sink")
    try:
        while not stop.is_set():
            msgs = consumer.consume(settings.batch_size * 4, timeout=0.5)
            now_ms = int(time.time() * 1000)
            for m in records(msgs, "sink"):
                sink.add(m, now_ms)
            SINK_WAITING.set(sink.waiting())
            if sink.ends_wanted():
                sink.new_rows_from(consumer, consumer.assignment())
            if not sink.pending():
                continue
            try:
                with guard("sink flush"):  # a hung PostgreSQL: restart (counted), not stall
                    sink.flush()
                processed.inc(len(msgs))
            except REFUSALS as exc:
                if sink.refused():
                    log.warning("sink: PostgreSQL refused a value in the batch (%s); reading"
                                " it again with every row checked", exc)
                elif sink.careful():
                    log.warning("sink: PostgreSQL refused a batch whose rows all passed the"
                                " check (%s); reading it again to write it row by row", exc)
                else:
                    log.error("sink: PostgreSQL refused a batch whose rows it takes one by"
                              " one (%s); retrying", exc)
                sink.discard()
                _rewind_to_stored(consumer, sink, stop, retry_s)
            except DOWN as exc:
                log.warning("sink: PostgreSQL write failed (%s); rewinding and retrying", exc)
                sink.discard()
                _rewind_to_stored(consumer, sink, stop, retry_s)
        if sink.pending() or sink.waiting():  # stopping: write the rows still waiting
            try:
                sink.flush(everything=True)
            except (psycopg.Error, OSError, ServiceUnavailable) as exc:
                log.warning("sink: last flush failed (%s); its rows are read again at the"
                            " next start", exc)
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
            sink.new_rows_from(consumer, consumer.assignment())
            log.info("sink: PostgreSQL is back; resumed from stored offsets")
            return
        except (psycopg.Error, OSError, ServiceUnavailable) as exc:
            log.warning("sink: still waiting for PostgreSQL: %s", exc)
            sink.discard()
        except KafkaException as exc:  # seek on a partition not yet fetching
            log.warning("sink: seek failed (%s); reassigning", exc)
            consumer.assign(sink.stored_offsets(consumer.assignment()))
            sink.new_rows_from(consumer, consumer.assignment())
            return

