"""First attempts for the replay-console benchmark (``bench/console_replay.py``): a
steady stream of deliveries straight onto dispatch.v1, and a topic read back whole."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.harness import send_record
from postbacks.codec import codec_for
from postbacks.settings import Settings
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

__all__ = ["Stream", "per_second", "read_topic"]


class Stream(threading.Thread):
    """First attempts straight onto dispatch.v1 at a steady rate, enqueued_at = now."""

    def __init__(self, s: Settings, endpoints: list[tuple[str, str]], rate: float,
                 tag: str) -> None:
        super().__init__(name="first-attempts", daemon=True)
        self.s, self.endpoints, self.rate, self.tag = s, endpoints, rate, tag
        self.stop = threading.Event()
        self.enqueued: dict[str, int] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        codec = codec_for("Delivery")
        p = Producer({"bootstrap.servers": self.s.kafka_bootstrap_servers, "linger.ms": 2,
                      "acks": "all", "enable.idempotence": True})
        topic = self.s.topic(TOPICS.dispatch.base)
        p.list_topics(topic, timeout=10)
        start = time.monotonic()
        i = 0
        while not self.stop.is_set():
            ep, app = self.endpoints[i % len(self.endpoints)]
            now = int(time.time() * 1000)
            did = f"dlv_{self.tag}_f{i}"
            conv = make_conversion(event_id=f"evt_{self.tag}_f{i}",
                                   conversion_id=f"cv_{self.tag}_f{i}", app_id=app,
                                   occurred_at=now - 2000, source_created_at=now - 4000,
                                   source_completed_at=now - 9000)
            d = make_delivery(delivery_id=did, endpoint_id=ep, conversion=conv,
                              idempotency_key=f"msg_{self.tag}_f{i}", created_at=now,
                              enqueued_at=now)
            send_record(p, topic, codec.encode(d), ep.encode())
            self.enqueued[did] = now
            i += 1
            ahead = i / self.rate - (time.monotonic() - start)
            p.poll(0)
            if ahead > 0:
                time.sleep(ahead)
        assert p.flush(60) == 0


def read_topic(s: Settings, base_topic: str, *, want: int, idle_s: float = 20.0,
               timeout: float = 120.0) -> list[tuple[int, bytes | None, bytes]]:
    """(timestamp ms, key, value) of every record of a topic (from the start)."""
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                  "group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    topic = s.topic(base_topic)
    md = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out: list[tuple[int, bytes | None, bytes]] = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(2000, timeout=0.5)
            for m in msgs:
                if m.error() is None:
                    out.append((m.timestamp()[1], m.key(), m.value()))
            idle = time.monotonic() - last
            if msgs:
                last = time.monotonic()
            elif (len(out) >= want and idle > 1.0) or idle > idle_s:
                break
    finally:
        c.close()
    return out


def per_second(times_ms: list[int]) -> list[int]:
    if not times_ms:
        return []
    t0 = min(times_ms) // 1000
    c = Counter(t // 1000 - t0 for t in times_ms)
    return [c.get(i, 0) for i in range(max(c) + 1)]
