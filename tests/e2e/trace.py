"""Where a delivery is in Kafka: every record naming it on the delivery topics and the
agent's and gate's committed offsets on those partitions. For the message of a failing
end-to-end test (before its topics are deleted)."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from postbacks.codec import codec_for
from postbacks.settings import Settings
from topics import TOPICS
from topics.registry import GATE_APP

__all__ = ["trace_deliveries"]


def _read_all(consumer: Consumer, topic: str, partitions: int) -> list[Any]:
    tps = []
    for p in range(partitions):
        _lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if hi > 0:
            tps.append((p, hi))
    out: list[Any] = []
    if not tps:
        return out
    consumer.assign([TopicPartition(topic, p, 0) for p, _ in tps])
    left = {p: hi for p, hi in tps}
    idle = 0
    while left and idle < 10:
        msgs = consumer.consume(500, 0.5)
        idle = 0 if msgs else idle + 1
        for m in msgs:
            if m.error() is not None:
                continue
            out.append(m)
            if m.offset() + 1 >= left.get(m.partition(), 0):
                left.pop(m.partition(), None)
    consumer.unassign()
    return out


def trace_deliveries(settings: Settings, delivery_ids: list[str]) -> str:
    wanted = set(delivery_ids)
    consumer = Consumer({
        "bootstrap.servers": settings.kafka_bootstrap_servers,
        "group.id": f"test-trace-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": False,
    })
    lines: list[str] = []
    seen_parts: set[tuple[str, int]] = set()
    try:
        specs = [TOPICS.deliveries, TOPICS.dispatch, *TOPICS.retry, TOPICS.quarantine,
                 TOPICS.held, TOPICS.attempts, TOPICS.outcomes]
        for spec in specs:
            codec = codec_for(spec.record)
            topic = settings.topic(spec.base)
            for m in _read_all(consumer, topic, spec.partitions):
                try:
                    v = codec.decode(m.value())
                except Exception:  # a diagnostic reads what it can
                    continue
                if v.get("delivery_id") in wanted:
                    extra = v.get("result") or v.get("kind") or v.get("trigger")
                    lines.append(f"{spec.base}[{m.partition()}]@{m.offset()} "
                                 f"{v['delivery_id']} {extra}")
                    seen_parts.add((topic, m.partition()))
        for group in ("postbacks-agent", GATE_APP):
            c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                          "group.id": settings.topic(group), "enable.auto.commit": False})
            try:
                got = c.committed([TopicPartition(t, p) for t, p in sorted(seen_parts)],
                                  timeout=10)
            finally:
                c.close()
            lines += [f"{group} committed {tp.topic}[{tp.partition}] = {tp.offset}"
                      f" {tp.metadata[:40] if tp.metadata else ''}" for tp in got
                      if tp.offset >= 0]
    finally:
        consumer.close()
    return "\n".join(lines) or "no record names them"
