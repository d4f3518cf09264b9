"""A client call is retried on the codes a broker answers while leadership settles
(librdkafka does not mark them retriable), with the topic's metadata refreshed, up to a
deadline, and not on anything else. The consumer is a stand-in: what is tested is the
retry rule (``postbacks.kafka.leaders``); the reads that use it run on the real broker in
tests/integration/test_kafka_time_range.py and the sink's tests."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from postbacks.kafka.leaders import until_leader_known


class _Consumer:
    def __init__(self, failures: list[int]) -> None:
        self.failures = list(failures)
        self.refreshed: list[str] = []

    def offsets_for_times(self, parts: list[TopicPartition]) -> Any:
        if self.failures:
            raise KafkaException(KafkaError(self.failures.pop(0)))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in parts]

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed.append(topic)


PARTS = [TopicPartition("t", 0, 1000), TopicPartition("t", 1, 1000)]


def _call(c: _Consumer, deadline_s: float = 60.0) -> Any:
    return until_leader_known(c, ["t"], lambda: c.offsets_for_times(PARTS),  # type: ignore[arg-type]
                              deadline_s)


def test_not_leader_is_retried_with_the_metadata_refreshed() -> None:
    c = _Consumer([KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE])
    got = _call(c)
    assert [tp.offset for tp in got] == [7, 7]
    assert c.refreshed == ["t", "t"]


def test_a_lasting_not_leader_ends_at_the_deadline() -> None:
    c = _Consumer([KafkaError.NOT_LEADER_FOR_PARTITION] * 1000)
    with pytest.raises(KafkaException, match="Not leader"):
        _call(c, deadline_s=0.5)
    assert 1 <= len(c.refreshed) <= 5


def test_another_error_is_not_retried() -> None:
    c = _Consumer([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        _call(c)
    assert c.refreshed == []
