"""Reading one topic by produce time: every partition from its first record at or after
``since`` to its first record at or after ``until``, or to its end as it was when the read
began. The end is also reached at a partition EOF, so a topic written by transactional
producers (its last offsets are commit markers, never delivered) does not hang the read."""

from __future__ import annotations

import time
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from postbacks.settings import Settings

__all__ = ["read_time_range"]

# Codes a ListOffsets answers while leadership settles. librdkafka does not mark them
# retriable on the error offsets_for_times raises, so they are named here.
_TRANSIENT = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
})


def _offsets_for_times(c: Consumer, parts: list[TopicPartition],
                       deadline_s: float = 60.0) -> list[TopicPartition]:
    """``offsets_for_times``, retried while the error is retriable and ``deadline_s`` has
    not passed. A topic just created, or a leader just moved, answers
    NOT_LEADER_FOR_PARTITION until the broker and the client's metadata agree; each retry
    refreshes the client's metadata for the topic first."""
    deadline = time.monotonic() + deadline_s
    delay = 0.2
    while True:
        try:
            return list(c.offsets_for_times(parts, timeout=10))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in _TRANSIENT)
            if not retriable or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            for topic in {tp.topic for tp in parts}:
                c.list_topics(topic, timeout=10)


def read_time_range(settings: Settings, topic: str, since: int, until: int, *,
                    group_id: str) -> Iterator[Message]:
    """The committed records of ``topic`` with a timestamp in [since, until), partition by
    partition in offset order. ``group_id`` only names the reader: nothing is committed.
    Raises ValueError when the topic does not exist."""
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "group.id": group_id, "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None:
            raise ValueError(f"topic {topic}: {meta.error}")
        starts = _offsets_for_times(c, [TopicPartition(topic, p, since)
                                        for p in meta.partitions])
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in meta.partitions}
        todo = [tp for tp in starts if 0 <= tp.offset < ends[tp.partition]]
        if not todo:
            return
        c.assign(todo)
        left = {tp.partition for tp in todo}
        while left:
            for m in c.consume(1000, timeout=1.0):
                p = m.partition()
                if p not in left:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(p)
                    continue
                off = m.offset() or 0
                if off >= ends[p] or m.timestamp()[1] >= until:
                    left.discard(p)
                    continue
                if off + 1 >= ends[p]:
                    left.discard(p)
                yield m
    finally:
        c.close()
