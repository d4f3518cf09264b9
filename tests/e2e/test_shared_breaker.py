"""One circuit breaker per endpoint across agents and restarts (breakers.v1): a breaker one
agent opened is honoured by a second agent that takes the endpoint over, and by an agent
started after both died; neither sends the down endpoint a single request (the open period
outlasts the test, so the probe policy allows none), while healthy endpoints are served."""

from __future__ import annotations

import pytest

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.harness import Harness

THRESHOLD = 5
ENV = {
    "POSTBACKS_BREAKER_FAILURE_THRESHOLD": str(THRESHOLD),
    "POSTBACKS_BREAKER_OPEN_S": "600",  # no probe within the test
    "POSTBACKS_RETRY_BASE_S": "1",  # failed attempts come back to the agent at once
}


@pytest.fixture()
def h(settings: Settings, stack: Stack, namespace: str) -> Harness:
    harness = Harness(settings, stack, namespace)
    harness.start_receiver()
    return harness


def _quarantined(h: Harness, ep: str) -> int:
    return int(h.scalar("SELECT count(DISTINCT delivery_id) FROM delivery_outcomes"
                        " WHERE endpoint_id = %s AND kind = 'quarantined'", (ep,)))


def _agent(h: Harness, name: str, instance: str) -> None:
    h.stack.start(name, "agent", extra_env={**ENV, "POSTBACKS_INSTANCE_ID": instance})


def test_a_breaker_opened_by_one_agent_holds_in_another_and_after_a_restart(
        h: Harness) -> None:
    down = h.endpoint("down", concurrency=1)
    ok = h.endpoint("ok")
    h.script(down, statuses=[503])
    h.script(ok, statuses=[200])
    for stage in ("sink", "relay", "gate", "fanout"):
        h.stack.start(stage, stage, extra_env=ENV)
    _agent(h, "agent-a", "agent-a")

    h.emit("down", 30)
    # every delivery of the down endpoint diverted: the first THRESHOLD failed, then the
    # breaker opened; the failed ones came back through retry.5s and were diverted too
    wait_for(lambda: _quarantined(h, down) == 30, 90, what="30 quarantined deliveries")
    sent = len(h.received(down))
    assert sent == THRESHOLD

    # a second agent; then the first dies: the second has every partition now
    _agent(h, "agent-b", "agent-b")
    h.stack.procs["agent-a"].kill9()
    h.emit("ok", 20)
    h.emit("down", 30)
    h.wait_status(ok, "delivered", 20, timeout=90)
    wait_for(lambda: _quarantined(h, down) == 60, 90, what="60 quarantined deliveries")
    assert len(h.received(down)) == sent, "the second agent sent to an open breaker"

    # both gone; an agent started afresh (the first one's instance id, as a restart)
    h.stack.procs["agent-b"].kill9()
    _agent(h, "agent-a-restarted", "agent-a")
    h.emit("ok", 20)
    h.emit("down", 30)
    h.wait_status(ok, "delivered", 40, timeout=90)
    wait_for(lambda: _quarantined(h, down) == 90, 90, what="90 quarantined deliveries")
    assert len(h.received(down)) == sent, "the restarted agent sent to an open breaker"
    assert len(h.received(ok)) >= 40
