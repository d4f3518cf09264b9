"""webhook_backlog_age_seconds: the age of the last record consumed, per topic, set once
per consumed batch."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from postbacks.metrics import observe_backlog

CREATE_TIME = 1  # confluent_kafka.TIMESTAMP_CREATE_TIME


class Msg:
    def __init__(self, topic: str, ts: int, ts_type: int = CREATE_TIME,
                 error: object = None) -> None:
        self._topic, self._ts, self._type, self._error = topic, ts, ts_type, error

    def topic(self) -> str:
        return self._topic

    def timestamp(self) -> tuple[int, int]:
        return self._type, self._ts

    def error(self) -> Any:
        return self._error


def _age(topic: str) -> float | None:
    return REGISTRY.get_sample_value("webhook_backlog_age_seconds", {"topic": topic})


def test_each_topic_gets_the_age_of_its_last_record_in_the_batch() -> None:
    now = 1_800_000_000_000
    observe_backlog([Msg("ut.a", now - 9_000), Msg("ut.b", now - 4_000),
                     Msg("ut.a", now - 2_500), Msg("ut.b", now - 1_000, error="x"),
                     Msg("ut.c", 0, ts_type=0)], now)
    assert _age("ut.a") == 2.5  # the last of ut.a, not the first
    assert _age("ut.b") == 4.0  # an error event is no record
    assert _age("ut.c") is None  # no timestamp: nothing to say
    observe_backlog([Msg("ut.a", now + 5_000)], now)  # a clock ahead: never negative
    assert _age("ut.a") == 0.0
    observe_backlog([], now)
    assert _age("ut.a") == 0.0
