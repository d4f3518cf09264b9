"""Small helpers for tests that talk to the real broker and database."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer

from postbacks.codec import codec_for
from postbacks.db.connect import connect
from postbacks.settings import Settings


def joined(consumer: Consumer, topic: str) -> None:
    """Subscribe ``consumer`` and consume until the group has given it partitions (what it
    reads while joining is dropped), or fail after 30 s."""
    from postbacks.kafka.clients import consume_ready

    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while not consumer.assignment() and time.monotonic() < deadline:
        consume_ready(consumer, 500, 0.2)
    assert consumer.assignment(), "no partitions assigned within 30 s"


def read_topic(settings: Settings, base: str, n: int, timeout: float = 60.0) -> list[Any]:
    """Read at least ``n`` committed messages from the start of a topic (or fail)."""
    consumer = Consumer({
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    consumer.subscribe([settings.topic(base)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is None:
                    out.append(m)
    finally:
        consumer.close()
    assert len(out) >= n, f"{base}: expected {n} messages within {timeout}s, got {len(out)}"
    return out


def decode(record: str, msg: Any) -> dict[str, Any]:
    return codec_for(record).decode(msg.value())


def scalar(settings: Settings, sql: str, params: Any = None) -> Any:
    with connect(settings.database_url) as conn:
        row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The Java client's (and librdkafka murmur2_random's) partition for a non-null key."""
    length = len(key)
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    rest = length % 4
    tail = key[length - rest:]
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions
