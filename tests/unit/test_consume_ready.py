"""consume_ready's rebalance guard, with a scripted consumer (the broker behaviour itself is
in tests/integration/test_consume_ready.py)."""

from __future__ import annotations

from postbacks.kafka.clients import consume_ready
from tests.unit.factories import FakeMessage
from tests.unit.fake_kafka import TP, Msg


class Scripted:
    """consume() answers from a script; the second call revokes partition 0 (a rebalance
    served inside it)."""

    def __init__(self, batches: list[list[FakeMessage]]) -> None:
        self.batches = batches
        self.assigned = [TP("d", 0), TP("d", 1)]
        self.calls: list[tuple[int, float]] = []

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        self.calls.append((n, timeout))
        if len(self.calls) == 2:
            self.assigned = [TP("d", 1)]
        return self.batches.pop(0) if self.batches else []

    def assignment(self) -> list[TP]:
        return self.assigned


def test_waits_for_one_then_takes_what_is_there() -> None:
    c = Scripted([[Msg("d", 1)], [Msg("d", 1), Msg("d", 1)]])
    got = consume_ready(c, 10, 0.5)  # type: ignore[arg-type]
    assert len(got) == 3 and c.calls == [(1, 0.5), (9, 0)]


def test_nothing_arrived_means_one_call() -> None:
    c = Scripted([])
    assert consume_ready(c, 10, 0.5) == [] and c.calls == [(1, 0.5)]  # type: ignore[arg-type]


def test_records_of_a_partition_revoked_meanwhile_are_not_returned() -> None:
    first = Msg("d", 0)  # its partition is revoked during the second call
    err = Msg("d", 0, err="transient")  # errors pass through (records() reports them)
    kept = Msg("d", 1)
    c = Scripted([[first], [err, kept]])
    got = consume_ready(c, 10, 0.5)  # type: ignore[arg-type]
    assert got == [err, kept]
