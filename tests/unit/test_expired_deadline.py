"""The check for records retention deleted runs in a rebalance callback: it never raises
(a broker that does not answer leaves it unchecked, logged), it gives up as a whole within
its time (a timeout per partition could hold the assignment for minutes), and it reports
each loss once."""

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


def test_a_broker_that_does_not_answer_leaves_it_unchecked_not_the_assignment_failed(
) -> None:
    assert check_expired(Slow(), "g", [TopicPartition("t", 0)]) == 0  # type: ignore[arg-type]


def test_a_loss_is_reported_once_per_process() -> None:
    """A partition left empty after the loss keeps the same committed offset through every
    later rebalance: the same loss is not counted again."""
    from postbacks.kafka.expired import report_expired

    found = [("t_once", 0, 3, 7)]
    assert report_expired("g_once", found) == 4
    assert report_expired("g_once", found) == 0
    assert report_expired("g_once", [("t_once", 0, 7, 9)]) == 2  # a new loss after it


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
