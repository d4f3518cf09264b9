"""Stand-ins for confluent-kafka's Message and TopicPartition, for the consume helpers'
unit tests (the broker's own behaviour is tested against it in tests/integration)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.unit.factories import FakeMessage


def Msg(t: str, p: int, err: Any = None, n: int = 0) -> FakeMessage:
    """A record of partition ``p`` of topic ``t`` (its offset ``n``, for the tests to name
    it), or an error event when ``err`` is given."""
    return FakeMessage(b"", topic=t, partition=p, offset=n, error=err)


@dataclass
class TP:
    topic: str
    partition: int
