"""Records a consumer group never read because retention deleted them first: a stage down
longer than a topic's retention, or a consumer lagging past it. The client resumes at the
log's start (``auto.offset.reset=earliest``) and says so only in librdkafka's own log; the
monitor's lag then looks normal. Checked at every assignment (where a stage that was down
comes back; the gate, a Faust app, checks at its start and in its progress watch): each
such partition is logged as an error, its lost records counted in
``postbacks_records_expired_unread_total`` and the time in
``postbacks_records_expired_unread_last_timestamp_seconds`` (the alert
``PostbacksRecordsExpiredUnread`` reads the time: the counter's first sample already holds
the count, which ``increase()`` cannot see)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from postbacks.metrics import EXPIRED_LAST, EXPIRED_UNREAD

__all__ = ["check_expired", "expired_unread", "report_expired"]

log = logging.getLogger(__name__)


def expired_unread(c: Consumer, positions: Mapping[tuple[str, int], int],
                   timeout_s: float = 10.0) -> list[tuple[str, int, int, int]]:
    """``(topic, partition, position, log start)`` for each partition whose position (the
    offset the group resumes at; below 0: none) retention has deleted past. All of it
    within ``timeout_s`` (it runs in a rebalance callback: a broker away must not hold the
    assignment): KafkaException when the time runs out before every partition is seen."""
    deadline = time.monotonic() + timeout_s
    out = []
    for (topic, partition), position in sorted(positions.items()):
        if position < 0:
            continue  # nothing committed: below, with the time left
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                            f"out of time after {timeout_s:g} s"))
        low, _high = c.get_watermark_offsets(TopicPartition(topic, partition),
                                             timeout=left, cached=False)
        if position < low:
            out.append((topic, partition, position, low))
    # Partitions the group has no offset for start where the log does: only said when the
    # log no longer starts at 0, and only with the time the losses above left (an idle
    # partition never commits: there can be many of them).
    for (topic, partition), position in sorted(positions.items()):
        if position >= 0 or (topic, partition) in _looked:
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            low, _high = c.get_watermark_offsets(TopicPartition(topic, partition),
                                                 timeout=left, cached=False)
        except KafkaException:
            break
        _looked.add((topic, partition))
        _unstarted(topic, partition, low)
    return out


_looked: set[tuple[str, int]] = set()  # looked at once per process


def _unstarted(topic: str, partition: int, low: int) -> None:
    """A partition the group has no offset for, whose log no longer starts at 0: the
    group's first start on an old topic, or its offsets lost (the group deleted, or
    ``offsets.retention.minutes`` passed while it had no member), when everything from
    the log's start is processed again. Said once per process: a log line names it."""
    if low <= 0:
        return
    log.warning("%s[%d]: this group has no committed offset, and the log starts at %d: it "
                "reads from there. If the group ran before, its offsets were lost (the group "
                "deleted, its offsets expired while it had no member, or the sink's stored "
                "offsets removed) and the records from %d are processed again (their ids "
                "are stable: receivers deduplicate)", topic, partition, low, low)


def check_expired(c: Consumer, group: str, partitions: list[TopicPartition],
                  positions: Mapping[tuple[str, int], int] | None = None) -> int:
    """Log and count what :func:`expired_unread` finds for ``partitions`` (positions: the
    group's committed offsets in Kafka unless given); the records lost. Never raises: a
    broker that does not answer leaves it unchecked (logged), not the assignment failed."""
    if not partitions:
        return 0
    try:
        if positions is None:
            positions = {(tp.topic, tp.partition): tp.offset
                         for tp in c.committed(partitions, timeout=10)}
        found = expired_unread(c, positions)
    except Exception as exc:  # (the assignment matters more than the check)
        log.warning("%s: could not check for records deleted before they were read: %s",
                    group, exc)
        return 0
    return report_expired(group, found)


_reported: set[tuple[str, str, int, int]] = set()  # (group, topic, partition, position)


def report_expired(group: str, found: list[tuple[str, int, int, int]]) -> int:
    """Log and count each loss once per process (a partition left empty after it keeps the
    same committed offset through every later rebalance); the records newly reported."""
    lost = 0
    for topic, partition, position, low in found:
        if (group, topic, partition, position) in _reported:
            continue
        _reported.add((group, topic, partition, position))
        lost += low - position
        EXPIRED_UNREAD.labels(group=group, topic=topic).inc(low - position)
        EXPIRED_LAST.labels(group=group, topic=topic).set(time.time())
        log.error("%s: %s[%d]: %d record(s) deleted by retention before this group read "
                  "them (its position %d, the log now starts at %d): they are lost to it; "
                  "find them upstream (docs/runbooks/PostbacksRecordsExpiredUnread.md)",
                  group, topic, partition, low - position, position, low)
    return lost
