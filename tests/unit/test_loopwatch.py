"""The event-loop watch: a blocked loop shows in the lag histogram and is named in the log."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
from prometheus_client import REGISTRY

from postbacks.loopwatch import LoopWatch


def _lag(process: str, le: str) -> float:
    return REGISTRY.get_sample_value("postbacks_event_loop_lag_seconds_bucket",
                                     {"process": process, "le": le}) or 0.0


def _count(process: str) -> float:
    return REGISTRY.get_sample_value("postbacks_event_loop_lag_seconds_count",
                                     {"process": process}) or 0.0


def blocking_call_under_test() -> None:
    time.sleep(0.3)  # what a synchronous client call does to every other task


def test_a_blocked_loop_is_measured_and_its_blocker_named(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> LoopWatch:
        watch = LoopWatch("test-blocked", interval_s=0.01, report_s=0.1, quiet_s=10.0)
        watch.start()
        await asyncio.sleep(0.1)  # a few quiet ticks
        blocking_call_under_test()
        await asyncio.sleep(0.05)
        blocking_call_under_test()  # a second stall within quiet_s: measured, not logged
        await asyncio.sleep(0.05)
        watch.stop()
        return watch

    with caplog.at_level(logging.WARNING, logger="postbacks.loopwatch"):
        watch = asyncio.run(main())
    reports = [r.getMessage() for r in caplog.records if "event loop blocked" in r.getMessage()]
    assert len(reports) == 1 and watch.reports == 1
    assert "blocking_call_under_test" in reports[0]
    # two ticks waited ~0.29 s: over the 0.25-s bucket, not over the 0.5-s one
    assert _count("test-blocked") - _lag("test-blocked", "0.25") == 2
    assert _lag("test-blocked", "0.5") == _count("test-blocked")


def test_a_free_loop_reports_nothing(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> LoopWatch:
        watch = LoopWatch("test-free", interval_s=0.01, report_s=1.0)  # room for a busy host
        watch.start()
        for _ in range(20):
            await asyncio.sleep(0.01)
        watch.stop()
        return watch

    with caplog.at_level(logging.WARNING, logger="postbacks.loopwatch"):
        watch = asyncio.run(main())
    assert watch.reports == 0
    assert not [r for r in caplog.records if "event loop blocked" in r.getMessage()]
    assert _count("test-free") >= 5
    assert _lag("test-free", "1.0") == _count("test-free")


def block_the_loop_until(done: Callable[[], bool], limit_s: float) -> None:
    """Hold the loop (the blocking under test) until ``done`` or ``limit_s`` passes."""
    deadline = time.monotonic() + limit_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_loop_stuck_past_the_limit_restarts_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stuck loop in a process whose /metrics answers from its own thread: nothing else
    would notice (the agent's partitions waited for a person)."""
    from postbacks.kafka import watchdog

    restarts: list[tuple[str, bool]] = []
    monkeypatch.setattr(watchdog, "restart_in_place",
                        lambda why, dump=False, **_: restarts.append((why, dump)))

    async def main() -> float:
        watch = LoopWatch("test-stuck", interval_s=0.01, report_s=0.05, restart_after_s=0.2)
        watch.start()
        await asyncio.sleep(0)
        started = time.monotonic()
        block_the_loop_until(lambda: bool(restarts), 10.0)  # stuck until it fires
        held = time.monotonic() - started
        watch.stop()
        return held

    held = asyncio.run(main())
    assert restarts and restarts[0][1] is True  # with every thread's stack
    assert restarts[0][0].startswith("test-stuck: the event loop has not turned for")
    assert held >= 0.18  # not before the limit (its last turn came at most one tick before)

    restarts.clear()

    async def fine() -> None:
        watch = LoopWatch("test-fine", interval_s=0.01, report_s=0.05, restart_after_s=5.0)
        watch.start()
        block_the_loop_until(lambda: False, 0.1)  # blocked, far under the limit
        await asyncio.sleep(0.1)
        watch.stop()

    asyncio.run(fine())
    assert restarts == []
