"""Delay relay: retry.<tier>.v1 and quarantine.v1 -> dispatch.v1 once ``due_at`` has passed.

Each delay topic holds records in roughly due order, so the relay looks only at a
partition's head: when it is not yet due, the partition is **paused** and rewound to that
record, and resumed when it falls due. The consumer keeps polling (so it stays in its
group) with a poll timeout no longer than the wait for the earliest paused head: records
are never released early, and late by at most one poll plus one fetch. Republishing and
the input offsets go in one Kafka transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from postbacks.codec import codec_for
from postbacks.core.delay import is_due, wait_s
from postbacks.errors import DeadLetterError
from postbacks.kafka.clients import check_broker, make_consumer, make_transactional_producer
from postbacks.kafka.stage import Output, commit_batch, dead_letter_for
from postbacks.metrics import DLQ_TOTAL, LATENCY, STAGE_RECORDS, observe_backlog
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from postbacks.topics import TOPICS

__all__ = ["run_relay"]

log = logging.getLogger(__name__)


def run_relay(
    settings: Settings, stop: threading.Event, *, clock: Callable[[], float] = time.time
) -> None:
    check_broker(settings)
    codec = codec_for("Delivery")
    dlq = codec_for("DeadLetter")
    paused: dict[tuple[str, int], int] = {}

    def on_revoke(_c: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            paused.pop((tp.topic, tp.partition), None)

    consumer = make_consumer(settings, "postbacks-relay")
    producer = make_transactional_producer(settings, "relay")
    inputs = [settings.topic(t.base) for t in (*TOPICS.retry, TOPICS.quarantine)]
    consumer.subscribe(inputs, on_revoke=on_revoke)
    processed = STAGE_RECORDS.labels(stage="relay")
    try:
        while not stop.is_set():
            now_ms = int(clock() * 1000)
            for key, due in list(paused.items()):
                if is_due(due, now_ms):
                    consumer.resume([TopicPartition(*key)])
                    del paused[key]
            msgs = consumer.consume(settings.batch_size, timeout=wait_s(list(paused.values()),
                                                                      now_ms))
            now_ms = int(clock() * 1000)
            out = Output()
            offsets: dict[tuple[str, int], int] = {}
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.fatal():
                        raise KafkaException(err)
                    if err.code() != KafkaError._PARTITION_EOF:
                        log.warning("relay: consumer error: %s", err)
                    continue
                key = (m.topic() or "", m.partition() or 0)
                if key in paused:
                    continue  # behind a head that is not due yet; re-read after resume
                try:
                    d: DeliveryRecord = codec.decode(m.value())  # type: ignore[assignment]
                except DeadLetterError as exc:
                    DLQ_TOTAL.labels(stage="relay", reason=exc.reason).inc()
                    dl = dead_letter_for(m, "relay", exc, exc.reason, now_ms)
                    out.add(TOPICS.dlq.base, m.key(), dlq.encode(dl))
                    offsets[key] = (m.offset() or 0) + 1
                    continue
                if not is_due(d["due_at"], now_ms):
                    tp = TopicPartition(key[0], key[1], m.offset() or 0)
                    consumer.pause([tp])
                    consumer.seek(tp)
                    paused[key] = d["due_at"] or now_ms
                    continue
                observe_backlog(m, now_ms)
                if d["due_at"] is not None:
                    LATENCY.labels(phase="relay_lateness").observe((now_ms - d["due_at"]) / 1000)
                d["enqueued_at"] = now_ms
                out.add(TOPICS.dispatch.base, d["endpoint_id"].encode(), codec.encode(d))
                offsets[key] = (m.offset() or 0) + 1
            if offsets:
                commit_batch("relay", settings, consumer, producer, out, offsets)
                processed.inc(len(offsets))
    finally:
        consumer.close()
