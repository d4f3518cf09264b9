"""The single-payout check against the real broker, PostgreSQL and the gate process: an
endpoint paid $10 to $40 an hour for three weeks gets one $5,000 payout. Under value-rate
enforce it is held alone (payout_outlier, the peak named), the deliveries around it go
out, the endpoint is not halted; after a kill -9 of the gate the peak is still there (a
second outlier is held too); ``--single-multiple 0`` turns the check off."""

from __future__ import annotations

import pytest

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.gate_util import GateFeed
from tests.integration.anomaly_helpers import run_cli

USD = 1_000_000
HOUR_MS = 3_600_000


def _arm(monkeypatch: pytest.MonkeyPatch, settings: Settings, ep: str, *extra: str) -> None:
    assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "endpoint",
                   "--key", ep, "--detector", "value_rate", "--mode", "enforce", *extra,
                   "--actor", "alice", "--note", "armed") == 0


def test_one_payout_far_over_the_endpoints_peak_is_held_alone_and_survives_a_gate_kill(
        settings: Settings, stack: Stack, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    ep, off = f"ep_{namespace}_o", f"ep_{namespace}_off"
    _arm(monkeypatch, settings, ep)
    _arm(monkeypatch, settings, off, "--single-multiple", "0")
    feed = GateFeed(settings)
    t0 = feed.hour_ago(weeks=3) - 4 * HOUR_MS
    for hour in range(3 * 168):
        for e in (ep, off):
            feed.send(e, t0 + hour * HOUR_MS, (10 + 10 * (hour % 4)) * USD)
    stack.start("gate", "gate")
    feed.wait_outputs(2 * 3 * 168, timeout=120)
    assert feed.held() == []

    at = t0 + 3 * 168 * HOUR_MS + 60_000
    before = feed.dispatched_count()
    big = feed.send(ep, at, 5_000 * USD)
    small = feed.send(ep, at + 1_000, 30 * USD)
    unjudged = feed.send(off, at, 5_000 * USD)
    feed.wait_outputs(2 * 3 * 168 + 3)
    held = feed.held()
    assert [(d["delivery_id"], d["hold_reason"]) for d in held] == [(big, "payout_outlier")]
    assert {small, unjudged} <= set(feed.dispatched) and feed.dispatched_count() == before + 2

    # the gate killed and restarted: the endpoint's peak comes back with its state
    stack.procs["gate"].kill9()
    stack.start("gate", "gate")
    later = at + 3 * HOUR_MS  # the first outlier out of every value-rate span
    again = feed.send(ep, later, 4_000 * USD)
    wait_for(lambda: len(feed.held()) == 2, 90, what="the second outlier held")
    assert (feed.held()[-1]["delivery_id"], feed.held()[-1]["hold_reason"]) == (
        again, "payout_outlier")
    # the endpoint is not halted: an ordinary payout still goes out
    ordinary = feed.send(ep, later + 1_000, 20 * USD)

    def sent() -> bool:
        feed.poll()
        return ordinary in feed.dispatched

    wait_for(sent, 60, what="an ordinary payout dispatched")
