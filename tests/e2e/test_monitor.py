"""The monitor measures from outside: while the agent is stopped its group's backlog age
grows, and after it resumes the age and lag fall back to zero."""

from __future__ import annotations

import os
import signal
import time

from prometheus_client.parser import text_string_to_metric_families

from postbacks.settings import Settings
from postbacks.tools.procs import Proc, Stack, wait_for
from tests.e2e.harness import Harness


def _sample(monitor: Proc, name: str, **labels: str) -> float | None:
    page = monitor.metrics(timeout=3)
    if page is None:
        return None
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_backlog_age_grows_while_the_agent_is_stopped_and_falls_after(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    h = Harness(settings, stack, namespace)
    h.start_receiver()
    ep = h.endpoint("mon")
    h.start_stages()
    monitor = stack.start("monitor", "monitor",
                          extra_env={"POSTBACKS_MONITOR_INTERVAL_S": "0.5"})
    group, topic = settings.topic("postbacks-agent"), settings.topic("dispatch.v1")

    def age() -> float | None:
        return _sample(monitor, "webhook_backlog_age_seconds", group=group, topic=topic)

    def lag() -> float:
        return sum(_sample(monitor, "postbacks_consumer_lag_records", group=group, topic=topic,
                           partition=str(p)) or 0.0 for p in range(6))

    h.emit("mon", 10)
    wait_for(lambda: len(h.received(ep)) >= 10, 90, what="the first 10 delivered")
    wait_for(lambda: age() == 0.0 and lag() == 0, 60, what="the agent caught up (age 0)")

    agent = stack.procs["agent"]
    os.kill(agent.pid, signal.SIGSTOP)
    try:
        h.emit("mon", 10)
        wait_for(lambda: (age() or 0) > 1.0, 60, what="a backlog age while the agent is stopped")
        first = age() or 0.0
        wait_for(lambda: (age() or 0) >= first + 2.0, 30, what="the age growing")
        assert lag() >= 10  # none of the second batch finished (transaction markers count too)
        assert len(h.received(ep)) == 10
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    wait_for(lambda: len(h.received(ep)) >= 20, 120, what="the rest delivered after resuming")
    wait_for(lambda: age() == 0.0 and lag() == 0, 90, what="the age back to 0")
    assert (_sample(monitor, "postbacks_monitor_last_success_timestamp_seconds",
                    check="kafka") or 0) > time.time() - 30
    # the agent counted each delivery's payout once (1.25 USD each), at its delivered outcome
    assert _sample(agent, "webhook_payout_usd_total", outcome="delivered") == 20 * 1.25
