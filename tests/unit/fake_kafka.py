"""Stand-ins for confluent-kafka's Message and TopicPartition, for the consume helpers'
unit tests (the broker's own behaviour is tested against it in tests/integration)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Msg:
    t: str
    p: int
    err: Any = None
    n: int = 0  # which record it is, for the tests to name

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def error(self) -> Any:
        return self.err


@dataclass
class TP:
    topic: str
    partition: int
