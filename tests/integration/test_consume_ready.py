"""``consume_ready`` against the broker: a lone record is handed over when it arrives, not
when a batch would have filled (``Consumer.consume(n, timeout)`` waits for ``n`` records
or the whole timeout); records already fetched come in one batch."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from postbacks.kafka.clients import consume_ready, make_consumer
from postbacks.settings import Settings
from topics import TOPICS


def test_a_lone_record_does_not_wait_for_a_full_batch(settings: Settings) -> None:
    topic = settings.topic(TOPICS.dispatch.base)
    consumer = make_consumer(settings, "consume-ready")
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consume_ready(consumer, 500, 0.2)  # join the group
        assert consumer.assignment(), "no partitions assigned within 30 s"
        p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
        p.produce(topic, b"one", b"k", partition=0)
        assert p.flush(10) == 0

        t0 = time.monotonic()
        got = consume_ready(consumer, 500, 20.0)
        waited = time.monotonic() - t0
        assert [m.value() for m in got] == [b"one"]
        assert waited < 10.0, f"waited {waited:.1f}s: the lone record waited for the timeout"

        # one record batch (one produce request): a fetch carries all 30 or none, so the
        # first record's arrival means the other 29 are already fetched
        batcher = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                            "linger.ms": 1000, "batch.num.messages": 30})
        for i in range(30):
            batcher.produce(topic, str(i).encode(), b"k", partition=0)
        assert batcher.flush(10) == 0
        got = consume_ready(consumer, 500, 20.0)
        assert [m.value() for m in got] == [str(i).encode() for i in range(30)]
        assert consume_ready(consumer, 1, 0.1) == []  # nothing left: an empty list
    finally:
        consumer.close()
