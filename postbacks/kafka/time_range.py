"""Reading one topic by produce time: every partition from its first record at or after
``since`` to its first record at or after ``until``, or to its end as it was when the read
began. The end is also reached at a partition EOF, so a topic written by transactional
producers (its last offsets are commit markers, never delivered) does not hang the read."""

from __future__ import annotations

from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from postbacks.kafka.leaders import until_leader_known
from postbacks.settings import Settings

__all__ = ["OFFSETS_DEADLINE_S", "read_time_range"]

OFFSETS_DEADLINE_S = 60.0  # for the start offsets of a topic whose leaders are settling

def read_time_range(settings: Settings, topic: str, since: int, until: int, *,
                    group_id: str) -> Iterator[Message]:
    """The committed records of ``topic`` with a timestamp in [since, until), partition by
    partition in offset order. ``group_id`` only names the reader: nothing is committed.
    Raises ValueError when the topic does not exist."""
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "group.id": group_id, "client.id": group_id, "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        if meta.error is not None:
            raise ValueError(f"topic {topic}: {meta.error}")
        wanted = [TopicPartition(topic, p, since) for p in meta.partitions]
        starts = until_leader_known(c, [topic],
                                    lambda: list(c.offsets_for_times(wanted, timeout=10)),
                                    OFFSETS_DEADLINE_S)
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
