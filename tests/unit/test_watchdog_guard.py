"""The Kafka-call watchdog's bookkeeping: a guard's own limit, nesting, and the overdue
list the watchdog thread restarts on (pure; the restart itself is exercised by the broker
restart tests)."""

from __future__ import annotations

import time

from postbacks.kafka import watchdog


def test_a_guard_is_overdue_after_its_own_limit_or_else_the_watchdogs() -> None:
    now = time.monotonic()
    with watchdog.guard("commit", limit_s=45):
        assert watchdog.overdue(120, now + 44) == []
        stuck = watchdog.overdue(120, now + 46)
        assert [w for w, _s in stuck] == ["commit"]
    with watchdog.guard("plain"):
        assert watchdog.overdue(120, now + 100) == []
        assert [w for w, _s in watchdog.overdue(120, now + 121)] == ["plain"]
    assert watchdog.overdue(120, now + 1000) == []  # nothing guarded any more


def test_an_inner_guard_stands_for_its_thread_then_the_outer_is_back_unchanged() -> None:
    t0 = time.monotonic()
    with watchdog.guard("transaction"):
        with watchdog.guard("send_offsets", limit_s=45):
            assert [w for w, _s in watchdog.overdue(120, t0 + 50)] == ["send_offsets"]
        # the outer guard is back, counted from when it began
        assert watchdog.overdue(120, t0 + 50) == []
        stuck = watchdog.overdue(120, t0 + 125)
        assert [w for w, _s in stuck] == ["transaction"] and stuck[0][1] >= 125 - 1
    assert watchdog.overdue(120, t0 + 1000) == []
