"""Read every stage group's progress from the broker (:class:`~postbacks.core.backlog.
PartitionProgress`): committed offsets, log ends, and the timestamp of the oldest record
each group has yet to finish.

One admin client asks for the committed offsets and the log ends in two calls per round; a
group-less consumer then reads one record at each lagging partition's position for its
timestamp (bounded by ``peek_timeout_s``). Nothing here joins a group or commits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from postbacks.codec import codec_for
from postbacks.core.backlog import PartitionProgress, lag_of, position_of
from postbacks.core.delay import ripe_at
from postbacks.core.quarantine import QUARANTINE_PERIOD_MS
from postbacks.errors import DeadLetterError, ServiceUnavailable
from postbacks.settings import Settings
from topics.registry import RETRY_TIERS, TOPICS, GroupSpec

__all__ = ["ProgressReader"]

_NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has committed nothing here
Stored = Mapping[tuple[str, str, int], int]  # (group, topic, partition) -> next offset
# What a peek found at a position: (timestamp ms, due_at ms) of its first record, or
# _CAUGHT_UP: the partition ends before any record (nothing but transaction markers).
Head = tuple[int | None, int | None] | str
_CAUGHT_UP = "caught-up"


def _due_at(value: bytes | None, period_ms: int | None, now_ms: int) -> int | None:
    """When a delay-topic record is due to leave (its ``due_at``, or in a retry tier when
    it ripens: :func:`~postbacks.core.delay.ripe_at`); None when it has none or cannot be
    read: then its age counts from when it was written."""
    try:
        d = codec_for("Delivery").decode(value)
    except DeadLetterError:
        return None
    return ripe_at(d.get("due_at"), d.get("enqueued_at"), period_ms, now_ms)


def _offset_of(info: Any) -> int:
    """A ListOffsetsResultInfo's offset (its type stub omits the attribute)."""
    return int(info.offset)


class ProgressReader:
    """Progress of the stage groups in ``groups`` (registry specs, names prefixed here)."""

    def __init__(self, settings: Settings, groups: Sequence[GroupSpec], *,
                 timeout_s: float = 10.0, peek_timeout_s: float = 3.0) -> None:
        self.settings = settings
        self.groups = list(groups)
        self.timeout_s = timeout_s
        self.peek_timeout_s = peek_timeout_s
        base = {"bootstrap.servers": settings.kafka_bootstrap_servers,
                "client.id": "postbacks-monitor"}
        self._admin = AdminClient(base)
        self._delay_topics = {settings.topic(t.base) for t in (*TOPICS.retry, TOPICS.quarantine)}
        self._periods = {settings.topic(TOPICS.retry_tier(n).base): s * 1000
                         for n, s in RETRY_TIERS}
        self._periods[settings.topic(TOPICS.quarantine.base)] = QUARANTINE_PERIOD_MS
        self._peeker_conf = {
            **base, "group.id": settings.topic("postbacks-monitor"),
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "isolation.level": "read_committed", "fetch.wait.max.ms": 50,
            "enable.partition.eof": True,  # the end before any record: caught up
        }

    def close(self) -> None:
        """Nothing is held between rounds (each peek has its own consumer)."""

    def read(self, stored: Stored | None) -> list[PartitionProgress]:
        """One round: every partition of every group's inputs. ``stored`` holds the offsets
        of groups kept in PostgreSQL (the sink's); None when they could not be read, and
        those groups are left out of the round. Raises ServiceUnavailable when the broker
        does not answer in time."""
        groups = [g for g in self.groups if stored is not None or g.offsets != "postgres"]
        try:
            partitions = self._partitions(groups)
            committed = self._committed(groups, partitions, stored or {})
            ends, starts = self._ends(partitions)
            parts = [
                PartitionProgress(group, topic, p, committed.get((group, topic, p)),
                                  starts.get((topic, p), 0), ends.get((topic, p), 0))
                for group, topic, p in self._keys(groups, partitions)
            ]
            out = []
            for group in {x.group for x in parts}:  # one peek per group: one position each
                mine = [x for x in parts if x.group == group]
                heads = self._peek([x for x in mine if lag_of(x) > 0])
                for x in mine:
                    head = heads.get((x.topic, x.partition))
                    if head == _CAUGHT_UP:  # only transaction markers after the position
                        x = replace(x, end=position_of(x))
                    elif isinstance(head, tuple):
                        x = replace(x, oldest_ms=head[0], due_ms=head[1])
                    out.append(x)
        except (KafkaException, TimeoutError, FutureTimeout) as exc:
            raise ServiceUnavailable(f"Kafka: {exc or type(exc).__name__}") from exc
        return out

    def _keys(self, groups: Sequence[GroupSpec], partitions: Mapping[str, int],
              ) -> list[tuple[str, str, int]]:
        return [(self.settings.topic(g.base), self.settings.topic(t), p)
                for g in groups for t in g.inputs
                for p in range(partitions.get(self.settings.topic(t), 0))]

    def _partitions(self, groups: Sequence[GroupSpec]) -> dict[str, int]:
        meta = self._admin.list_topics(timeout=self.timeout_s)
        wanted = {self.settings.topic(t) for g in groups for t in g.inputs}
        return {name: len(t.partitions) for name, t in meta.topics.items()
                if name in wanted and t.error is None}

    def _committed(self, groups: Sequence[GroupSpec], partitions: Mapping[str, int],
                   stored: Stored) -> dict[tuple[str, str, int], int]:
        out: dict[tuple[str, str, int], int] = {}
        for g in groups:
            group = self.settings.topic(g.base)
            tps = [TopicPartition(self.settings.topic(t), p) for t in g.inputs
                   for p in range(partitions.get(self.settings.topic(t), 0))]
            if not tps:
                continue
            if g.offsets == "postgres":
                out.update({(group, tp.topic, tp.partition): stored[(group, tp.topic,
                                                                     tp.partition)]
                            for tp in tps if (group, tp.topic, tp.partition) in stored})
                continue
            futures = self._admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, tps)], request_timeout=self.timeout_s)
            result = futures[group].result(timeout=self.timeout_s + 5)
            for tp in result.topic_partitions or []:
                if tp.error is None and tp.offset != _NO_OFFSET and tp.offset >= 0:
                    out[(group, tp.topic, tp.partition)] = tp.offset
        return out

    def _ends(self, partitions: Mapping[str, int],
              ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        tps = [TopicPartition(t, p) for t, n in partitions.items() for p in range(n)]
        if not tps:
            return {}, {}
        found: list[dict[tuple[str, int], int]] = []
        for spec in (OffsetSpec.latest(), OffsetSpec.earliest()):
            futures = self._admin.list_offsets(
                {tp: spec for tp in tps}, isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self.timeout_s)
            found.append({(tp.topic, tp.partition):
                          _offset_of(f.result(timeout=self.timeout_s + 5))
                          for tp, f in futures.items()})
        return found[0], found[1]

    def _peek(self, lagging: Sequence[PartitionProgress]) -> dict[tuple[str, int], Head]:
        """For each lagging position (one per partition: one group's), the broker timestamp
        of the first record there and its ``due_at`` on a delay topic, or
        ``_CAUGHT_UP`` when the partition ends before any record (transaction markers
        only); bounded by ``peek_timeout_s``."""
        wanted = {(x.topic, x.partition): position_of(x) for x in lagging}
        if not wanted:
            return {}
        out: dict[tuple[str, int], Head] = {}
        waiting = set(wanted)
        # A consumer of its own per peek: events fetched for another group's positions
        # (an end-of-partition, a record before this position) cannot reach this one.
        peeker = Consumer(self._peeker_conf)
        peeker.assign([TopicPartition(t, p, off) for (t, p), off in wanted.items()])
        try:
            deadline = time.monotonic() + self.peek_timeout_s
            while waiting and time.monotonic() < deadline:
                for m in peeker.consume(500, timeout=0.2):
                    key = (m.topic() or "", m.partition() or 0)
                    if key not in waiting:
                        continue
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            continue
                        out[key] = _CAUGHT_UP
                    else:
                        ts_type, ts = m.timestamp()
                        due = (_due_at(m.value(), self._periods.get(key[0]),
                                       int(time.time() * 1000))
                               if key[0] in self._delay_topics else None)
                        out[key] = (ts if ts_type and ts > 0 else None, due)
                    waiting.discard(key)
                    peeker.pause([TopicPartition(*key)])
        finally:
            peeker.close()
        return out
