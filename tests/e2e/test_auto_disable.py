"""Auto-disable and re-enable through the real pipeline (seed 003): endpoints that only fail
are disabled by the monitor after a (shortened) window, one answering 410 Gone at once
under ``disable_on_gone``; their later deliveries are parked, never dropped; re-enabling
delivers the backlog, skips it, or keeps it parked and resumes from now."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.harness import Harness
from tests.kafka_util import decode, read_topic, scalar

FAILING = ("deliver", "skip", "keep")
ROOT = Path(__file__).resolve().parents[2]


def _enable(env: dict[str, str], endpoint_id: str, backlog: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "postbacks", "endpoints", "enable", endpoint_id, "--backlog",
         backlog, "--actor", "ops@test", "--note", "receiver fixed"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _ok(h: Harness, endpoint_id: str) -> list[dict[str, Any]]:
    return [r for r in h.received(endpoint_id) if r["status"] == 200]


def test_failing_endpoints_are_disabled_parked_and_re_enabled_three_ways(
    settings: Settings, own_database: str, stack_env: dict[str, str], namespace: str,
) -> None:
    # Its own database: the monitor disables any endpoint that only fails, other tests' too.
    settings = dataclasses.replace(settings, database_url=own_database)
    env = {"POSTBACKS_AUTO_DISABLE_AFTER_S": "2", "POSTBACKS_MONITOR_INTERVAL_S": "0.5"}
    stage_env = {**stack_env, **env, "POSTBACKS_DATABASE_URL": own_database}
    with Stack(stage_env, ROOT / ".local" / "test-logs" / namespace) as stack:
        _scenario(settings, stack, stage_env, namespace)


def _view_checked(stack: Stack) -> float:
    """The agent's postbacks_endpoint_view_checked_timestamp_seconds."""
    for line in (stack.procs["agent"].metrics() or "").splitlines():
        if line.startswith("postbacks_endpoint_view_checked_timestamp_seconds "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _scenario(settings: Settings, stack: Stack, stage_env: dict[str, str],
              namespace: str) -> None:
    h = Harness(settings, stack, namespace)
    h.start_receiver()
    eps = {name: h.endpoint(name, config={"max_attempts": 1}) for name in FAILING}
    gone = h.endpoint("gone", config={"max_attempts": 1, "disable_on_gone": True})
    for ep in eps.values():
        h.script(ep, statuses=[503] * 1000)
    h.script(gone, statuses=[410] * 1000)
    h.start_stages()
    stack.start("monitor", "monitor")

    for name in FAILING:
        h.emit(name, 2)
    h.emit("gone", 1)

    def disabled() -> dict[str, str]:
        with_reason = {}
        for ep in (*eps.values(), gone):
            why = scalar(settings, "SELECT disabled_reason FROM endpoints WHERE endpoint_id = %s"
                         " AND disabled_at IS NOT NULL", (ep,))
            if why is not None:
                with_reason[ep] = why
        return with_reason

    wait_for(lambda: len(disabled()) == 4, 90, what="all four endpoints disabled")
    reasons = disabled()
    assert "410 Gone" in reasons[gone]
    assert all(reasons[ep].startswith("only failures since") for ep in eps.values())
    events = [decode("OperationalEvent", m) for m in read_topic(settings, "operations.v1", 4)]
    assert {e["endpoint_id"] for e in events if e["kind"] == "endpoint.disabled"} == \
        {*eps.values(), gone}
    assert scalar(settings, "SELECT count(*) FROM audit_log WHERE action = 'endpoint.disabled'"
                  " AND target_id LIKE %s", (f"ep_{namespace}_%",)) == 4

    # the agent's endpoint view refreshed since the last disable (it parks by that view)
    disabled_by = time.time()
    wait_for(lambda: _view_checked(stack) > disabled_by, 30,
             what="the agent's endpoint view refreshed after the disables",
             progress=lambda: (_view_checked(stack), disabled_by))
    # while disabled: deliveries are parked, never sent, never dropped
    sent_before = {ep: len(h.received(ep)) for ep in eps.values()}
    for name in FAILING:
        h.emit(name, 3)
    for ep in eps.values():
        h.wait_status(ep, "held", 3)
        assert scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = %s"
                      " AND status = 'held' AND hold_reason = 'endpoint_disabled'", (ep,)) == 3
    assert {ep: len(h.received(ep)) for ep in eps.values()} == sent_before

    for ep in eps.values():
        h.script(ep, statuses=[200] * 1000)
    assert "released 3 parked deliveries" in _enable(stage_env, eps["deliver"], "deliver")
    assert "rejected 3 parked deliveries" in _enable(stage_env, eps["skip"], "skip")
    assert "stays held" in _enable(stage_env, eps["keep"], "keep")

    h.wait_status(eps["deliver"], "delivered", 3)
    assert len(_ok(h, eps["deliver"])) == 3
    h.wait_status(eps["skip"], "rejected", 3)
    # resumed from now: new deliveries go out, the parked ones stay held
    h.emit("keep", 2)
    h.emit("skip", 1)
    h.wait_status(eps["keep"], "delivered", 2)
    h.wait_status(eps["skip"], "delivered", 1)
    assert h.status_counts(eps["keep"]).get("held") == 3
    assert len(_ok(h, eps["skip"])) == 1  # only the new one: the skipped were never sent
    # nothing lost: every delivery of every endpoint is in a state someone can see
    for ep in (*eps.values(), gone):
        counts = h.status_counts(ep)
        assert set(counts) <= {"exhausted", "dead_lettered", "held", "delivered", "rejected"}, \
            (ep, counts)
    assert sum(h.status_counts(eps["keep"]).values()) == 2 + 3 + 2
    audit = scalar(settings, "SELECT count(*) FROM audit_log WHERE action = 'endpoint.enabled'"
                   " AND target_id LIKE %s", (f"ep_{namespace}_%",))
    assert audit == 3
