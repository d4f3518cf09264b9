"""The check for records retention deleted runs in a rebalance callback: with brokers that
do not answer it gives up as a whole within its time (a timeout per partition could hold
the assignment for minutes), leaving the partitions unchecked, logged."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from postbacks.kafka.expired import check_expired, expired_unread


class Slow:
    def __init__(self) -> None:
        self.calls = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool
                              ) -> tuple[int, int]:
        self.calls += 1
        time.sleep(min(timeout, 0.05))  # a broker that does not answer
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Any]:
        return [TopicPartition(tp.topic, tp.partition, 5) for tp in partitions]


def test_a_broker_that_does_not_answer_leaves_it_unchecked_in_time() -> None:
    parts = [TopicPartition("t", p) for p in range(40)]
    started = time.monotonic()
    assert check_expired(Slow(), "g", parts) == 0  # type: ignore[arg-type]
    assert time.monotonic() - started < 5


def test_the_check_as_a_whole_is_bounded() -> None:
    class Answers(Slow):
        def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool
                                  ) -> tuple[int, int]:
            self.calls += 1
            time.sleep(0.03)
            return (0, 10)

    c = Answers()
    try:
        expired_unread(c, {("t", p): 5 for p in range(100)}, timeout_s=0.3)  # type: ignore[arg-type]
    except KafkaException as exc:
        assert "out of time" in str(exc)
    else:
        raise AssertionError("not bounded")
    assert c.calls < 20
