"""Client factories with the settings every stage shares.

Consumers read ``read_committed`` and never auto-commit: offsets move only inside a
producer transaction (stages) or a PostgreSQL transaction (the sink).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from postbacks.errors import ServiceUnavailable
from postbacks.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "check_broker",
    "consume_gathered",
    "consume_ready",
    "make_consumer",
    "make_producer",
    "make_transactional_producer",
    "producer_config",
    "records",
    "transactional_config",
]


def _base(settings: Settings, client_id: str = "postbacks") -> dict[str, Any]:
    return {"bootstrap.servers": settings.kafka_bootstrap_servers, "client.id": client_id}


def make_consumer(settings: Settings, group: str, **extra: Any) -> Consumer:
    """A consumer of ``group`` (prefixed like a topic); its ``client.id`` is the group's
    unprefixed name, so the broker's request log, quotas and group descriptions name the
    stage."""
    conf = {
        **_base(settings, group),
        "group.id": settings.topic(group),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "session.timeout.ms": settings.consumer_session_timeout_ms,
        "heartbeat.interval.ms": max(500, settings.consumer_session_timeout_ms // 5),
        "max.poll.interval.ms": 300_000,
        "fetch.wait.max.ms": 100,
        **extra,
    }
    return Consumer(conf)


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    """Idempotent producer, acks=all (``POSTBACKS_KAFKA_ACKS``, which accepts nothing else):
    an ack means the record is on ``min.insync.replicas`` brokers (2 of 3 on a cluster), so
    it survives the loss of any one of them.

    Keys are partitioned with murmur2, as the Java client and Faust/aiokafka do, so every
    producer of a delivery topic puts one endpoint on the same partition number (the
    anomaly gate's co-partitioning depends on it)."""
    return {
        **_base(settings),
        "partitioner": "murmur2_random",
        "enable.idempotence": True,
        "acks": settings.kafka_acks,
        "linger.ms": 5,
        "compression.type": settings.kafka_compression,
        **extra,
    }


def make_producer(settings: Settings, **extra: Any) -> Producer:
    """A producer with :func:`producer_config`."""
    return Producer(producer_config(settings, **extra))


def transactional_config(settings: Settings, stage: str,
                         client: str | None = None) -> dict[str, Any]:
    """A stage's transactional producer: its ``transactional.id`` is the stage and the
    instance id (unique per process), so a restarted instance fences its predecessor; its
    ``client.id`` is ``postbacks-<client>`` (``client`` defaults to the stage)."""
    txn_id = settings.topic(f"postbacks-{stage}-{settings.instance_id}")
    return producer_config(settings, **{"transactional.id": txn_id, "linger.ms": 5,
                                        "client.id": f"postbacks-{client or stage}",
                                        "retry.backoff.ms": settings.txn_retry_backoff_ms})


def make_transactional_producer(settings: Settings, stage: str,
                                client: str | None = None) -> Producer:
    producer = Producer(transactional_config(settings, stage, client))
    try:
        producer.init_transactions(30)
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka transactions unavailable at {settings.kafka_bootstrap_servers}: {exc}. "
            "Is the broker up (`make services-up`)?"
        ) from exc
    return producer


def check_broker(settings: Settings, timeout: float = 10.0) -> None:
    """Fail fast with a clear message when the broker cannot be reached."""
    # librdkafka logs every refused reconnect (10 a second); the exception below says it once
    producer = Producer({**_base(settings), "socket.connection.setup.timeout.ms": 5000,
                         "log_level": 2})
    try:
        producer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ServiceUnavailable(
            f"Kafka is not reachable at {settings.kafka_bootstrap_servers} "
            f"(KAFKA_BOOTSTRAP_SERVERS): {exc}. Start it with `make services-up` "
            "(or `bash deploy/local/services.sh up`)."
        ) from exc


def consume_ready(consumer: Consumer, n: int, timeout: float) -> list[Message]:
    """Up to ``n`` records: wait at most ``timeout`` for the first, then take only what is
    already fetched.

    ``Consumer.consume(n, timeout)`` returns when ``n`` records have arrived *or* the
    timeout has passed, so below ``n`` records per timeout every record waited the whole
    timeout: measured, a lone record took 2.0 s through ``consume(500, 2.0)``. Under load
    the second call still returns full batches (librdkafka has fetched ahead).

    A rebalance served inside the second call can revoke the partition a record of the
    first came from (within one call librdkafka drops such records itself): only records
    of partitions still assigned are returned, the new owner reads the others."""
    first = consumer.consume(1, timeout)
    if not first or n <= 1:
        return first
    msgs = first + consumer.consume(n - 1, 0)
    owned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    return [m for m in msgs if m.error() is not None or (m.topic(), m.partition()) in owned]


def consume_gathered(consumer: Consumer, n: int, timeout: float, within: float,
                     rebalances: Callable[[], int]) -> list[Message]:
    """:func:`consume_ready`, then whatever else arrives within ``within`` seconds of the
    first record, up to ``n`` records: a stage committing one transaction per batch
    commits one per ``within`` at a steady low rate instead of one per fetch (each writes
    a marker to every partition it produced to, and its offsets). On a backlog the first
    call returns ``n`` records and nothing waits.

    ``rebalances()`` counts this consumer's revocations and losses. If one happens while
    gathering, the records gathered before it are dropped (error events are kept, for
    :func:`records` to report): none of them was handled, and the partitions' owner reads
    them again from the committed offsets. After an eager rebalance a partition assigned
    again is read from there too, so keeping them would handle those records twice. This
    rule needs eager assignment, where every revocation takes the whole assignment, as
    every consumer made by :func:`make_consumer` has: under cooperative assignment a
    partial revocation would drop records of partitions this consumer keeps and has read
    past."""
    msgs = consume_ready(consumer, n, timeout)
    if not msgs or within <= 0:
        return msgs
    until = time.monotonic() + within
    seen = rebalances()
    while len(msgs) < n and (left := until - time.monotonic()) > 0:
        more = consume_ready(consumer, n - len(msgs), left)
        if rebalances() != seen:
            return [m for m in msgs if m.error() is not None] + more
        msgs += more
    return msgs


def records(msgs: list[Message], stage: str) -> Iterator[Message]:
    """The records of a consumed batch: a fatal client error ends the process (raised), a
    transient one is logged and skipped, end-of-partition events are dropped."""
    for m in msgs:
        err = m.error()
        if err is None:
            yield m
            continue
        if err.fatal():
            raise KafkaException(err)
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("%s: consumer error: %s", stage, err)
