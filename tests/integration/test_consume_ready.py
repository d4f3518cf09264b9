"""``consume_ready`` against the broker: a lone record is handed over when it arrives, not
when a batch would have filled (``Consumer.consume(n, timeout)`` waits for ``n`` records
or the whole timeout); records already fetched come in one batch. ``consume_gathered``
adds what arrives within its window (the fan-out's one transaction per window)."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Producer

from postbacks.kafka.clients import consume_gathered, consume_ready, make_consumer
from postbacks.settings import Settings
from tests.kafka_util import joined
from topics import TOPICS


def test_a_lone_record_does_not_wait_for_a_full_batch(settings: Settings) -> None:
    topic = settings.topic(TOPICS.dispatch.base)
    consumer = make_consumer(settings, "consume-ready")
    try:
        joined(consumer, topic)
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


def test_records_sent_apart_within_the_window_come_in_one_batch(settings: Settings) -> None:
    topic = settings.topic(TOPICS.dispatch.base)
    consumer = make_consumer(settings, "consume-gathered")
    try:
        joined(consumer, topic)
        consume_ready(consumer, 500, 1.0)  # whatever the topic held before
        p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "linger.ms": 0})

        def send_apart(tag: str) -> threading.Thread:
            def send() -> None:  # three produce requests, 50 ms apart
                for i in range(3):
                    p.produce(topic, f"{tag}{i}".encode(), b"k", partition=0)
                    p.flush(10)
                    time.sleep(0.05)
            t = threading.Thread(target=send)
            t.start()
            return t

        sending = send_apart("a")
        got = consume_gathered(consumer, 500, 20.0, 2.0, lambda: 0)
        sending.join()
        assert [m.value() for m in got] == [b"a0", b"a1", b"a2"]

        sending = send_apart("b")  # without the window the first fetch is the batch
        got = consume_ready(consumer, 500, 20.0)
        sending.join()
        rest = consume_ready(consumer, 500, 2.0) + consume_ready(consumer, 500, 2.0)
        assert 0 < len(got) < 3 and [m.value() for m in got + rest] == [b"b0", b"b1", b"b2"]
    finally:
        consumer.close()
