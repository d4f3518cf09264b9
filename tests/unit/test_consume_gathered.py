"""consume_gathered's window and rebalance rule, with a scripted consumer on a virtual clock
(the broker behaviour is in tests/integration/test_consume_ready.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from postbacks.kafka import clients
from postbacks.kafka.clients import consume_gathered
from tests.unit.factories import FakeMessage
from tests.unit.fake_kafka import TP, Msg


@dataclass
class Timed:
    """consume(n, timeout) hands over the records scheduled by now, up to n, else moves the
    virtual clock to the next one or to the timeout. ``revoke_at`` is an eager rebalance
    served inside the call that passes that time: the revocation is counted and the
    partitions are assigned again."""

    schedule: list[tuple[float, FakeMessage]]
    revoke_at: float | None = None
    revoked: int = 0
    now: float = 0.0
    calls: list[tuple[int, float]] = field(default_factory=list)

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        self.calls.append((n, timeout))
        until = self.now + timeout
        while True:
            if self.revoke_at is not None and self.now >= self.revoke_at:
                self.revoke_at, self.revoked = None, self.revoked + 1
            ready = [m for at, m in self.schedule if at <= self.now][:n]
            if ready or self.now >= until:
                self.schedule = [(at, m) for at, m in self.schedule
                                 if not any(m is r for r in ready)]
                return ready
            later = [at for at, _ in self.schedule if at > self.now]
            self.now = min([until, *later, *([self.revoke_at] if self.revoke_at else [])])

    def assignment(self) -> list[TP]:
        return [TP("d", 0), TP("d", 1)]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(c: Timed) -> Timed:
        monkeypatch.setattr(clients.time, "monotonic", lambda: c.now)
        return c
    return use


def gather(c: Timed, n: int = 500, within: float = 0.2) -> list[int]:
    got = consume_gathered(c, n, 1.0, within, lambda: c.revoked)  # type: ignore[arg-type]
    return [m.offset() for m in got]


def test_records_arriving_within_the_window_come_in_one_batch(clock: Any) -> None:
    c = clock(Timed([(0.0, Msg("d", 0, n=1)), (0.03, Msg("d", 1, n=2)), (0.06, Msg("d", 0, n=3)),
                     (0.5, Msg("d", 0, n=4))]))
    assert gather(c) == [1, 2, 3]
    assert c.now == pytest.approx(0.2)  # the window ran out; record 4 was not waited for
    assert gather(c) == [4]


def test_the_window_starts_at_the_first_record(clock: Any) -> None:
    c = clock(Timed([(0.7, Msg("d", 0, n=1)), (0.85, Msg("d", 0, n=2)), (0.95, Msg("d", 0, n=3))]))
    assert gather(c) == [1, 2]


def test_a_full_batch_does_not_wait(clock: Any) -> None:
    c = clock(Timed([(0.0, Msg("d", 0, n=i)) for i in range(5)] + [(0.01, Msg("d", 0, n=9))]))
    assert gather(c, n=5, within=10.0) == [0, 1, 2, 3, 4]
    assert c.now == 0.0


def test_the_batch_stops_at_n_while_gathering(clock: Any) -> None:
    c = clock(Timed([(0.0, Msg("d", 0, n=1)), (0.05, Msg("d", 0, n=2)), (0.05, Msg("d", 0, n=3)),
                     (0.1, Msg("d", 0, n=4))]))
    assert gather(c, n=3, within=10.0) == [1, 2, 3]
    assert c.now == pytest.approx(0.05)


def test_no_window_is_one_fetch(clock: Any) -> None:
    c = clock(Timed([(0.0, Msg("d", 0, n=1)), (0.03, Msg("d", 0, n=2))]))
    assert gather(c, within=0.0) == [1]
    assert c.calls == [(1, 1.0), (499, 0)]


def test_a_rebalance_while_gathering_drops_what_came_before_it(clock: Any) -> None:
    # records 1 and 2 were fetched under the old assignment; after the revocation the
    # partitions' owner (this consumer again, or another) reads them again from the
    # committed offsets, so they must not be handled here as well
    c = clock(Timed([(0.0, Msg("d", 0, n=1)), (0.02, Msg("d", 1, n=2)), (0.1, Msg("d", 0, n=3))],
                    revoke_at=0.05))
    assert gather(c, within=0.3) == [3]


def test_error_events_are_kept_across_a_drop(clock: Any) -> None:
    c = clock(Timed([(0.0, Msg("d", 0, n=1)), (0.01, Msg("d", 0, n=7, err="transport")),
                     (0.1, Msg("d", 0, n=3))], revoke_at=0.05))
    assert gather(c, within=0.3) == [7, 3]
