"""create_topics' wait for leaders, against scripted metadata (the broker case is in
tests/integration/test_topic_admin.py; a warm broker rarely shows the window)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from postbacks.errors import ServiceUnavailable
from topics.admin import _wait_led


def _md(**topics: list[int]) -> Any:
    """Metadata: topic -> leader per partition (-1: no leader yet)."""
    return SimpleNamespace(topics={
        name: SimpleNamespace(error=None, partitions={
            i: SimpleNamespace(leader=leader, error=None) for i, leader in enumerate(leaders)})
        for name, leaders in topics.items()})


class Admin:
    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def list_topics(self, timeout: float) -> Any:
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


def test_waits_until_every_partition_of_every_created_topic_has_a_leader() -> None:
    admin = Admin(_md(),  # not in the metadata yet
                  _md(a=[1, 1], b=[1]),  # a: one partition short
                  _md(a=[1, -1, 1], b=[1]),  # a leaderless partition
                  _md(a=[1, 1, 1], b=[1], other=[-1]))  # others do not matter
    _wait_led(admin, {"a": 3, "b": 1})  # type: ignore[arg-type]
    assert admin.calls == 4


def test_a_partition_that_never_gets_a_leader_is_a_clear_error_naming_it() -> None:
    admin = Admin(_md(a=[1], b=[-1]))
    with pytest.raises(ServiceUnavailable, match=r"without a leader after 0.3 s: b$"):
        _wait_led(admin, {"a": 1, "b": 1}, timeout=0.3)  # type: ignore[arg-type]
    assert admin.calls >= 2


def test_metadata_that_cannot_be_read_is_named_as_such() -> None:
    from confluent_kafka import KafkaError, KafkaException

    class Down:
        def list_topics(self, timeout: float) -> Any:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    with pytest.raises(ServiceUnavailable, match=r"metadata is unreadable: .*broker down"):
        _wait_led(Down(), {"a": 1}, timeout=0.2)  # type: ignore[arg-type]
