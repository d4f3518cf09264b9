"""A halt reaches what is already past the gate. Seed §5.11: a global trip halts *all*
outgoing delivery -- deliveries waiting in a retry tier or in quarantine when the scope
trips are held by the agent (hold reason ``halted_global`` / ``halted_endpoint``), not
sent; after the audited close, a release sends them with their idempotency keys."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.anomaly import Detector, Trip
from postbacks.kafka.clients import make_producer
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from streams.anomaly_gate.control import breaker_state
from tests.e2e.harness import Harness
from tests.integration.anomaly_helpers import run_cli
from topics import TOPICS

RETRY_AFTER_S = 20  # the failed attempts, and the endpoint's others, come back this long after


@pytest.fixture()
def h(settings: Settings, stack: Stack, namespace: str) -> Harness:
    harness = Harness(settings, stack, namespace)
    harness.start_receiver()
    return harness


def _trip(settings: Settings, scope: str, key: str) -> None:
    """What a gate publishes when it trips a scope (streams/anomaly_gate/control.py)."""
    trip = Trip(scope, key, Detector.VALUE_RATE, 500_000_000, 10_000_000.0,
                int(time.time() * 1000) // 60_000 * 60_000)
    k, rec = breaker_state(trip, settings.anomaly_global_key, int(time.time() * 1000))
    p: Producer = make_producer(settings)
    p.produce(settings.topic(TOPICS.anomaly_control.base),
              codec_for("BreakerState").encode(rec), k)
    assert p.flush(10) == 0


def _held(h: Harness, endpoint_id: str, reason: str) -> int:
    return int(h.scalar("SELECT count(DISTINCT delivery_id) FROM delivery_outcomes WHERE"
                        " endpoint_id = %s AND kind = 'held' AND reason = %s",
                        (endpoint_id, reason)))


@pytest.mark.parametrize("scope", ["global", "endpoint"])
def test_a_halt_holds_the_retries_already_past_the_gate_until_closed_and_released(
        h: Harness, settings: Settings, monkeypatch: pytest.MonkeyPatch, scope: str) -> None:
    flaky, other = h.endpoint("flaky"), h.endpoint("other")
    h.script(flaky, statuses=[503], headers={"Retry-After": str(RETRY_AFTER_S)})
    h.start_stages()
    h.emit("flaky", 5)
    # The first answer's Retry-After holds the endpoint: those already in flight failed and
    # wait in a retry tier, the others wait in quarantine, unsent, for the same time.
    def held_back() -> int:
        return int(h.scalar("SELECT count(DISTINCT delivery_id) FROM delivery_outcomes WHERE"
                            " endpoint_id = %s AND kind = 'quarantined'", (flaky,)))

    wait_for(lambda: len(h.received(flaky)) + held_back() == 5, 90,
             what="5 deliveries failed or held back by the endpoint's Retry-After",
             progress=lambda: (len(h.received(flaky)), held_back()))
    first = len(h.received(flaky))
    assert 1 <= first <= 5

    # The gate trips the scope while they wait (due RETRY_AFTER_S after the first answer,
    # as the endpoint asked).
    key = settings.anomaly_global_key if scope == "global" else flaky
    _trip(settings, scope, key)
    h.script(flaky, statuses=[200])  # the endpoint is back: they would now succeed
    reason = f"halted_{scope}"
    wait_for(lambda: _held(h, flaky, reason) == 5, RETRY_AFTER_S + 60,
             what=f"the 5 deliveries held ({reason})")
    h.wait_status(flaky, "held", 5)
    assert len(h.received(flaky)) == first, "a delivery went out in a tripped scope"

    # An endpoint halt holds that endpoint only; a global one holds everything, new
    # conversions too (the gate holds those itself).
    h.emit("other", 3)
    if scope == "endpoint":
        h.wait_status(other, "delivered", 3)
    else:
        h.wait_status(other, "held", 3)
        assert h.received(other) == []

    # Only the audited close lifts it; the held ones go out when a person releases them.
    assert run_cli(monkeypatch, settings, "anomaly", "close", "--scope", scope, "--key", key,
                   "--detector", "value_rate", "--actor", "carol",
                   "--note", "payouts checked") == 0
    assert run_cli(monkeypatch, settings, "held", "release", "--endpoint", flaky,
                   "--actor", "alice", "--note", "checked with finance") == 0
    h.wait_status(flaky, "delivered", 5)
    keys = {r["idempotency_key"] for r in h.received(flaky)}
    assert len(keys) == 5, keys  # the same five deliveries, their keys unchanged
