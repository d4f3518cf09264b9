"""The gate's progress watchdog: a partition with records waiting whose committed offset
has not moved for ``stall_restart_s`` means the gate has stopped processing it (seen once
in roughly twenty test runs: after a kill -9 and restart, a gate that had its partitions
assigned and logged "gate running" processed nothing for 85 s, with no error logged; and a
gate given, in a rebalance, a partition the instance before it had read but never
committed, which it then did not read). Two causes of such stalls in Faust's fetch loop
after a rebalance are fenced off (``faust_patches.patch_faust_seek_fence``); the watch
stays as the backstop for any other. A partition never committed counts from its oldest
record. A stalled partition is never acceptable, so the process restarts in place (nothing is lost:
offsets are committed only after the state and outputs they cover are acknowledged).

The check reads, from outside Faust, the gate group's committed offsets and the
high-water marks of ``deliveries.v1`` and ``anomaly.partials.v1`` (a confluent consumer
with the gate's group id that never joins the group). While the gate is healthy its
offsets move every commit interval whenever there is something to read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

from postbacks.kafka.expired import check_expired, report_expired
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["ProgressWatch"]

log = logging.getLogger(__name__)


def check_expired_at_start(settings: Settings, group: str) -> None:
    """Before the gate consumes: records retention deleted before the gate read them (it
    was down longer than a topic's retention), logged and counted (postbacks.kafka.expired);
    Faust itself would resume at the log's start without a word."""
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": group,
                  "client.id": "postbacks-gate-watch", "enable.auto.commit": False})
    try:
        check_expired(c, group, [
            TopicPartition(settings.topic(base), p)
            for base, parts in ((TOPICS.deliveries.base, TOPICS.deliveries.partitions),
                                (TOPICS.anomaly_partials.base, TOPICS.anomaly_partials.partitions))
            for p in range(parts)])
    finally:
        c.close()


@dataclass
class ProgressWatch:
    settings: Settings
    group: str
    stall_s: float
    _consumer: Consumer | None = None
    _since: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    _said: set[tuple[str, int]] = field(default_factory=set)  # logged as still

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                "bootstrap.servers": self.settings.kafka_bootstrap_servers,
                "group.id": self.group, "enable.auto.commit": False,
                "client.id": "postbacks-gate-watch", "isolation.level": "read_committed",
            })
        return self._consumer

    def stalled(self, now: float | None = None) -> str | None:
        """A description of a partition stuck for ``stall_s`` with records waiting, or None.
        Blocking (Kafka metadata calls): run it in a thread."""
        now = time.monotonic() if now is None else now
        c = self._client()
        tps = []
        for base, parts in ((TOPICS.deliveries.base, TOPICS.deliveries.partitions),
                            (TOPICS.anomaly_partials.base, TOPICS.anomaly_partials.partitions)):
            tps += [TopicPartition(self.settings.topic(base), p) for p in range(parts)]
        try:
            committed = c.committed(tps, timeout=10)
            for tp in committed:
                low, high = c.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10)
                if 0 <= tp.offset < low:  # retention deleted what the gate had not read
                    report_expired(self.group, [(tp.topic, tp.partition, tp.offset, low)])
                key = (tp.topic, tp.partition)
                # never committed: the gate starts at the oldest record (offset reset
                # earliest), so records there wait as much as behind a committed offset
                offset = tp.offset if tp.offset >= 0 else low
                if offset >= high:  # nothing waiting
                    self._since.pop(key, None)
                    continue
                seen = self._since.get(key)
                if seen is None or seen[0] != offset:
                    self._since[key] = (offset, now)
                    self._said.discard(key)
                    continue
                still = now - seen[1]
                if still < self.stall_s / 2:
                    continue
                if not self._record_at(tp.topic, tp.partition, offset):
                    # only a commit marker after it: nothing waits, the partition is idle.
                    # Still is counted from now: a record arriving after a long quiet
                    # spell is not a stall before the gate had a chance to commit it.
                    self._since[key] = (offset, now)
                    continue
                if still >= self.stall_s:
                    what = "committed offset" if tp.offset >= 0 else "never committed, offset"
                    return (f"{tp.topic}[{tp.partition}] {what} {offset} has not "
                            f"moved for {still:.0f}s with records waiting "
                            f"(high water {high})")
                if key not in self._said:  # a stall in the making: say so, once
                    self._said.add(key)
                    log.info("%s[%d]: committed offset %d still for %.0f s with records "
                             "waiting (high water %d)", tp.topic, tp.partition, offset,
                             still, high)
        except KafkaException as exc:  # the broker is away: not the gate's stall
            # A new client next time: after a broker's loss this one kept asking the dead
            # leader for watermarks (timed out every check for minutes, the three-broker kill
            # test), blind to a gate stalled meanwhile; a new one reads the leaders afresh.
            log.warning("progress check skipped (a new client for the next): %s", exc)
            self._since.clear()
            self.close()
        return None

    def _record_at(self, topic: str, partition: int, offset: int) -> bool:
        """Is there a committed data record at or after ``offset``? (A transaction's commit
        marker occupies an offset too, and the gate commits only past the records it
        processed: a gap of markers alone is not work waiting.)"""
        probe = Consumer({
            "bootstrap.servers": self.settings.kafka_bootstrap_servers,
            "group.id": f"{self.group}-progress-probe", "enable.auto.commit": False,
            "client.id": "postbacks-gate-watch", "isolation.level": "read_committed",
        })
        try:
            probe.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                for m in probe.consume(10, timeout=0.5):
                    if m.error() is None:
                        return True
            return False
        finally:
            probe.close()

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:  # closing is best effort
                log.warning("progress check client close: %s", exc)
