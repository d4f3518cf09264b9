"""``consume_gathered`` across a real rebalance: a second consumer joins the group while the
first gathers over a long window. Each consumer handles a batch and commits its offsets
(with the consumer's generation, as a stage's transaction does); a batch whose commit is
refused by the rebalance is not counted, and its records are read again from the
committed offsets. Every record must be in exactly one committed batch: a record gathered
before the revocation and kept would also be read by its partition's new owner."""

from __future__ import annotations

import threading
import time
from collections import Counter

from confluent_kafka import KafkaException, Producer, TopicPartition

from postbacks.kafka.clients import consume_gathered, make_consumer
from postbacks.settings import Settings
from topics import TOPICS

TOTAL = 1500


def test_every_record_is_in_one_committed_batch_across_a_join(settings: Settings) -> None:
    topic = settings.topic(TOPICS.dispatch.base)
    committed: Counter[bytes] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    revocations = {"a": 0, "b": 0}
    errors: list[BaseException] = []
    assigned = {"a": threading.Event(), "b": threading.Event()}

    def run(name: str) -> None:
        def revoked(_c: object, _p: list[TopicPartition]) -> None:
            revocations[name] += 1

        def assign(_c: object, p: list[TopicPartition]) -> None:
            if p:
                assigned[name].set()

        consumer = make_consumer(settings, "gathered-rebalance")
        consumer.subscribe([topic], on_assign=assign, on_revoke=revoked, on_lost=revoked)
        try:
            while not stop.is_set():
                msgs = consume_gathered(consumer, 500, 0.2, 0.5, lambda: revocations[name])
                batch = [m for m in msgs if m.error() is None]
                if not batch:
                    continue
                offsets: dict[tuple[str, int], int] = {}
                for m in batch:
                    offsets[(m.topic() or "", m.partition() or 0)] = (m.offset() or 0) + 1
                try:
                    consumer.commit(offsets=[TopicPartition(t, p, o)
                                             for (t, p), o in offsets.items()],
                                    asynchronous=False)
                except KafkaException:
                    continue  # refused by the rebalance: read again from the committed offsets
                with lock:
                    committed.update(m.value() or b"" for m in batch)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            consumer.close()

    a = threading.Thread(target=run, args=("a",))
    a.start()
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "linger.ms": 0})
    b = threading.Thread(target=run, args=("b",))
    try:
        assert assigned["a"].wait(30), "the first consumer got no partitions within 30 s"
        for i in range(TOTAL):  # about 3 s of records over every partition
            producer.produce(topic, str(i).encode(), str(i).encode())
            producer.poll(0)
            if i == TOTAL // 3:
                b.start()  # joins while the first consumer is gathering
            time.sleep(0.002)
        assert producer.flush(10) == 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(committed) >= TOTAL:
                    break
            time.sleep(0.2)
    finally:
        stop.set()
        a.join(30)
        if b.is_alive() or b.ident is not None:
            b.join(30)
    assert not errors, errors
    assert revocations["a"] >= 1, "the second consumer's join revoked nothing"
    missing = [i for i in range(TOTAL) if str(i).encode() not in committed]
    twice = sorted(int(v) for v, n in committed.items() if n > 1)
    assert not missing, f"{len(missing)} records in no committed batch, e.g. {missing[:5]}"
    assert not twice, f"{len(twice)} records in two committed batches, e.g. {twice[:5]}"
