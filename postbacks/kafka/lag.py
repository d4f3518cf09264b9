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
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from postbacks.codec import codec_for
from postbacks.core.backlog import PartitionProgress, lag_of, position_of
from postbacks.errors import ServiceUnavailable, UndecodableRecord
from postbacks.settings import Settings
from topics.registry import TOPICS, GroupSpec

__all__ = ["ProgressReader"]

_NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has committed nothing here
Stored = Mapping[tuple[str, str, int], int]  # (group, topic, partition) -> next offset


def _due_at(value: bytes | None) -> int | None:
    """A delay-topic record's ``due_at`` (None when it has none or cannot be read: then its
    age counts from when it was written)."""
    try:
        due = codec_for("Delivery").decode(value).get("due_at")
    except UndecodableRecord:
        return None
    return int(due) if due is not None else None


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
        self._peeker = Consumer({
            **base, "group.id": settings.topic("postbacks-monitor"),
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "isolation.level": "read_committed", "fetch.wait.max.ms": 50,
        })

    def close(self) -> None:
        self._peeker.close()

    def read(self, stored: Stored) -> list[PartitionProgress]:
        """One round: every partition of every group's inputs. ``stored`` holds the offsets
        of groups kept in PostgreSQL (the sink's). Raises ServiceUnavailable when the
        broker does not answer."""
        try:
            partitions = self._partitions()
            committed = self._committed(partitions, stored)
            ends, starts = self._ends(partitions)
        except KafkaException as exc:
            raise ServiceUnavailable(f"Kafka: {exc}") from exc
        parts = [
            PartitionProgress(group, topic, p, committed.get((group, topic, p)),
                              starts.get((topic, p), 0), ends.get((topic, p), 0))
            for group, topic, p in self._keys(partitions)
        ]
        heads = self._peek([x for x in parts if lag_of(x) > 0])
        out = []
        for x in parts:
            ts, due = heads.get((x.topic, x.partition, position_of(x)), (None, None))
            out.append(PartitionProgress(x.group, x.topic, x.partition, x.committed, x.start,
                                         x.end, ts, due))
        return out

    def _keys(self, partitions: Mapping[str, int]) -> list[tuple[str, str, int]]:
        return [(self.settings.topic(g.base), self.settings.topic(t), p)
                for g in self.groups for t in g.inputs
                for p in range(partitions.get(self.settings.topic(t), 0))]

    def _partitions(self) -> dict[str, int]:
        meta = self._admin.list_topics(timeout=self.timeout_s)
        wanted = {self.settings.topic(t) for g in self.groups for t in g.inputs}
        return {name: len(t.partitions) for name, t in meta.topics.items()
                if name in wanted and t.error is None}

    def _committed(self, partitions: Mapping[str, int], stored: Stored,
                   ) -> dict[tuple[str, str, int], int]:
        out: dict[tuple[str, str, int], int] = {}
        for g in self.groups:
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
            result = futures[group].result(timeout=self.timeout_s)
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
            found.append({(tp.topic, tp.partition): _offset_of(f.result(timeout=self.timeout_s))
                          for tp, f in futures.items()})
        return found[0], found[1]

    def _peek(self, lagging: Sequence[PartitionProgress],
              ) -> dict[tuple[str, int, int], tuple[int | None, int | None]]:
        """The broker timestamp of the first record at each lagging position, and its
        ``due_at`` on a delay topic, keyed by (topic, partition, position); bounded by
        ``peek_timeout_s``."""
        wanted = {(x.topic, x.partition): position_of(x) for x in lagging}
        if not wanted:
            return {}
        out: dict[tuple[str, int, int], tuple[int | None, int | None]] = {}
        waiting = dict(wanted)
        paused: list[TopicPartition] = []
        self._peeker.assign([TopicPartition(t, p, off) for (t, p), off in wanted.items()])
        try:
            deadline = time.monotonic() + self.peek_timeout_s
            while waiting and time.monotonic() < deadline:
                for m in self._peeker.consume(500, timeout=0.2):
                    key = (m.topic() or "", m.partition() or 0)
                    if m.error() is not None or key not in waiting:
                        continue
                    ts_type, ts = m.timestamp()
                    if ts_type and ts > 0:
                        due = _due_at(m.value()) if key[0] in self._delay_topics else None
                        out[(key[0], key[1], waiting[key])] = (ts, due)
                    del waiting[key]
                    paused.append(TopicPartition(*key))
                    self._peeker.pause(paused[-1:])
        finally:
            # A pause outlives the assignment in librdkafka: undo it, or the next round
            # would read nothing from these partitions.
            if paused:
                self._peeker.resume(paused)
            self._peeker.unassign()
        return out
