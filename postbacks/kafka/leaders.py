"""A client call retried while the partitions it asks about have no leader this client
knows: a topic created a moment ago, or a leader that just moved. librdkafka answers
NOT_LEADER_FOR_PARTITION and the like until its metadata catches up, and does not mark
those errors ``retriable()``, so they are named here. Each retry refreshes the metadata
of the topics concerned."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException

__all__ = ["NO_LEADER_YET", "until_leader_known"]

T = TypeVar("T")

NO_LEADER_YET = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
})


def until_leader_known(c: Consumer, topics: Iterable[str], call: Callable[[], T],
                       deadline_s: float) -> T:
    """``call()``, retried (0.2 s, doubling to 2 s) while it raises a retriable or
    no-leader-yet error and ``deadline_s`` has not passed; then that error is raised."""
    names = set(topics)
    deadline = time.monotonic() + deadline_s
    delay = 0.2
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in NO_LEADER_YET)
            if not retriable or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            for topic in names:
                c.list_topics(topic, timeout=10)
