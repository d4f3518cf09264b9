"""A complete attempt log through kill -9 of the agent mid-load: every request the receiver
got has its attempt row (the ones whose result the dead agent never recorded as ``unknown``
/ ``agent_lost``), a re-sent request is an attempt of its own with the same idempotency
key, and nothing is lost."""

from __future__ import annotations

from collections import Counter

import pytest

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.harness import Harness

PER_ENDPOINT = 40
ENDPOINTS = 8


@pytest.fixture()
def h(settings: Settings, stack: Stack, namespace: str) -> Harness:
    harness = Harness(settings, stack, namespace)
    harness.start_receiver()
    return harness


def _rows_per_key(h: Harness, eps: list[str]) -> Counter[str]:
    with_rows = h.scalar(
        "SELECT coalesce(json_object_agg(k, n), '{}') FROM (SELECT idempotency_key k,"
        " count(*) n FROM delivery_attempts WHERE endpoint_id = ANY(%s)"
        " GROUP BY idempotency_key) t", (eps,))
    return Counter({k: int(n) for k, n in with_rows.items()})


def test_kill_9_of_the_agent_mid_load_leaves_every_request_in_the_attempt_log(
        h: Harness) -> None:
    eps = [h.endpoint(f"k{i}") for i in range(ENDPOINTS)]
    for ep in eps:
        h.script(ep, statuses=[200], delay_ms=400)  # requests are in flight at the kill
    h.start_stages()
    for i in range(ENDPOINTS):
        h.emit(f"k{i}", PER_ENDPOINT)
    total = ENDPOINTS * PER_ENDPOINT
    wait_for(lambda: len(h.received()) >= total // 3, 90, interval=0.02,
             what="a third of the requests sent")
    h.stack.procs["agent"].kill9()
    h.stack.start("agent-restarted", "agent")
    for ep in eps:
        h.wait_status(ep, "delivered", PER_ENDPOINT, timeout=120)

    received = Counter(r["webhook_id"] for r in h.received() if r["endpoint_id"] in eps)
    assert len(received) == total  # 0 lost
    assert all(r["status"] == 200 for r in h.received())

    def covered() -> bool:  # every request received has its row (the sink may lag)
        rows = _rows_per_key(h, eps)
        return all(rows[k] >= n for k, n in received.items())

    wait_for(covered, 60, what="an attempt row for every request received "
                               f"(received {sum(received.values())})")
    twice = [k for k, n in received.items() if n > 1]
    assert twice, "no request was re-sent: the kill found nothing in flight"
    lost = h.scalar(
        "SELECT coalesce(json_agg(json_build_array(idempotency_key, error_message)), '[]')"
        " FROM delivery_attempts WHERE endpoint_id = ANY(%s) AND result = 'unknown'"
        " AND error_class = 'agent_lost'", (eps,))
    assert lost, "the dead agent's requests are not in the attempt log"
    rows = _rows_per_key(h, eps)
    for key, message in lost:
        assert rows[key] >= 2  # the lost attempt and the re-sent one, one key
        assert "may have received" in message
    # a re-sent key: one row per request, at least, and one of them delivered
    delivered = h.scalar(
        "SELECT count(DISTINCT idempotency_key) FROM delivery_attempts"
        " WHERE endpoint_id = ANY(%s) AND result = 'delivered' AND idempotency_key = ANY(%s)",
        (eps, twice))
    assert delivered == len(twice)
    assert h.scalar("SELECT count(*) FROM attempt_intents WHERE endpoint_id = ANY(%s)"
                    " AND lost_at IS NULL", (eps,)) == 0  # none left pending
