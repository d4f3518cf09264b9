"""One-shot publishing for tools (the CLI, the console): a batch in one Kafka transaction, or
single records that must be acknowledged before the caller goes on.

Failures raise :class:`ServiceUnavailable` with what was (not) published, never a client
exception, so the CLI prints one line.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from postbacks.errors import ServiceUnavailable
from postbacks.kafka.clients import make_producer, make_transactional_producer
from postbacks.settings import Settings

__all__ = ["TransactionalPublisher", "publish_acked", "publish_transaction"]

Item = tuple[str, bytes | None, bytes]  # (full topic name, key, value)


def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes,
             on_delivery: Callable[[KafkaError | None, Message], None] | None = None) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(0.5)


def publish_transaction(settings: Settings, stage: str, items: Sequence[Item], *,
                        timeout_s: float = 60.0) -> None:
    """Publish every item in ONE committed transaction (all or nothing). The transactional
    id is unique per call (``<stage>-<uuid>``), so concurrent invocations never fence each
    other."""
    TransactionalPublisher(settings, stage).publish(items, timeout_s=timeout_s)


class TransactionalPublisher:
    """A long-lived transactional producer for a process that publishes batch after batch
    (the console's replay drainer): each :meth:`publish` is one committed transaction. A
    failure aborts, drops the producer (a fresh one is made for the next batch) and raises
    :class:`ServiceUnavailable`."""

    def __init__(self, settings: Settings, stage: str) -> None:
        self._settings = settings
        self._stage = stage
        self._producer: Producer | None = None

    def publish(self, items: Sequence[Item], *, timeout_s: float = 30.0) -> None:
        if not items:
            return
        if self._producer is None:
            self._producer = make_transactional_producer(
                self._settings, f"{self._stage}-{uuid.uuid4().hex[:12]}", self._stage)
        producer = self._producer
        try:
            producer.begin_transaction()
            for topic, key, value in items:
                _produce(producer, topic, key, value)
            producer.commit_transaction(timeout_s)
        except KafkaException as exc:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(10)
            self._producer = None
            raise ServiceUnavailable(
                f"Kafka transaction failed, nothing was published ({len(items)} record(s)): "
                f"{exc}") from exc


def publish_acked(settings: Settings, items: Sequence[Item], *, timeout_s: float = 30.0,
                  producer: Producer | None = None) -> None:
    """Produce and wait until every item is acknowledged (acks=all), or raise."""
    p = producer or make_producer(settings, **{"message.timeout.ms": int(timeout_s * 1000)})
    errors: list[str] = []
    acked = 0

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        nonlocal acked
        if err is not None:
            errors.append(f"{msg.topic()}: {err.str()}")
        else:
            acked += 1

    for topic, key, value in items:
        _produce(p, topic, key, value, on_delivery=on_delivery)
    left = p.flush(timeout_s)
    if errors or left or acked < len(items):
        detail = "; ".join(errors) or f"{left} record(s) not acknowledged within {timeout_s}s"
        raise ServiceUnavailable(
            f"Kafka did not acknowledge {len(items) - acked} of {len(items)} record(s) at "
            f"{settings.kafka_bootstrap_servers}: {detail}"
        )
