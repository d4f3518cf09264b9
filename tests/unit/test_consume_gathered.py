"""consume_gathered's window and rebalance rule, with a scripted consumer (the broker
behaviour is in tests/integration/test_consume_ready.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from postbacks.kafka.clients import consume_gathered


@dataclass
class Msg:
    p: int
    n: int = 0

    def topic(self) -> str:
        return "d"

    def partition(self) -> int:
        return self.p

    def error(self) -> Any:
        return None


@dataclass
class TP:
    topic: str
    partition: int


@dataclass
class Timed:
    """consume(n, timeout) hands over the records scheduled by now (seconds after the
    first call), up to n, else waits for the next one or the timeout; ``revoke_at`` counts a
    revocation once that time has passed (as a rebalance served inside a call would)."""

    schedule: list[tuple[float, Msg]]
    revoke_at: float | None = None
    revoked: int = 0
    t0: float = field(default_factory=time.monotonic)

    def consume(self, n: int, timeout: float) -> list[Msg]:
        until = time.monotonic() + timeout
        while True:
            now = time.monotonic() - self.t0
            if self.revoke_at is not None and now >= self.revoke_at:
                self.revoke_at, self.revoked = None, self.revoked + 1
            ready = [m for at, m in self.schedule if at <= now][:n]
            if ready or time.monotonic() >= until:
                self.schedule = [(at, m) for at, m in self.schedule
                                 if not any(m is r for r in ready)]
                return ready
            time.sleep(0.001)

    def assignment(self) -> list[TP]:
        return [TP("d", 0), TP("d", 1)]


def test_records_arriving_within_the_window_come_in_one_batch() -> None:
    c = Timed([(0.0, Msg(0, 1)), (0.03, Msg(1, 2)), (0.06, Msg(0, 3)), (0.5, Msg(0, 4))])
    got = consume_gathered(c, 500, 1.0, 0.2, lambda: c.revoked)  # type: ignore[arg-type]
    assert [m.n for m in got] == [1, 2, 3]
    got = consume_gathered(c, 500, 1.0, 0.2, lambda: c.revoked)  # type: ignore[arg-type]
    assert [m.n for m in got] == [4]


def test_a_full_batch_does_not_wait() -> None:
    c = Timed([(0.0, Msg(0, i)) for i in range(5)] + [(0.01, Msg(0, 9))])
    t0 = time.monotonic()
    got = consume_gathered(c, 5, 1.0, 10.0, lambda: c.revoked)  # type: ignore[arg-type]
    assert [m.n for m in got] == [0, 1, 2, 3, 4]
    assert time.monotonic() - t0 < 5.0


def test_no_window_is_one_fetch() -> None:
    c = Timed([(0.0, Msg(0, 1)), (0.03, Msg(0, 2))])
    got = consume_gathered(c, 500, 1.0, 0.0, lambda: c.revoked)  # type: ignore[arg-type]
    assert [m.n for m in got] == [1]


def test_a_rebalance_while_gathering_drops_what_came_before_it() -> None:
    # records 1 and 2 were fetched under the old assignment; after the revocation the
    # partitions' owner reads them again from the committed offsets, so they must not be
    # handled here as well
    c = Timed([(0.0, Msg(0, 1)), (0.02, Msg(1, 2)), (0.1, Msg(0, 3))], revoke_at=0.05)
    got = consume_gathered(c, 500, 1.0, 0.3, lambda: c.revoked)  # type: ignore[arg-type]
    assert [m.n for m in got] == [3]
