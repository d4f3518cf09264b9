"""Strict per-endpoint ordering through the real stages: while the first delivery of a
strict endpoint is retried (and the agent is killed and restarted in the middle), no later
delivery of it is sent; they arrive after it, in the order fan-out produced them. A
``none`` endpoint with the same failing first delivery is not held up by it."""

from __future__ import annotations

import time
from typing import Any

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.harness import Harness
from tests.kafka_util import decode, read_topic

N = 6


def _requests(h: Harness, endpoint_id: str) -> list[tuple[str, int, float]]:
    return [(r["idempotency_key"], r["status"], r["at"]) for r in h.received(endpoint_id)]


def _fanout_order(settings: Settings, endpoint_id: str, total: int) -> list[str]:
    """The endpoint's deliveries in the order fan-out wrote them (one partition)."""
    recs: list[dict[str, Any]] = [decode("Delivery", m)
                                  for m in read_topic(settings, "deliveries.v1", total)]
    return [r["idempotency_key"] for r in recs if r["endpoint_id"] == endpoint_id]


def test_strict_endpoint_waits_for_its_retried_head_across_an_agent_restart(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    h = Harness(settings, stack, namespace)
    h.start_receiver()
    strict = h.endpoint("strict", config={"ordering": "strict"})
    loose = h.endpoint("loose", concurrency=1)  # first requests go out in order
    # the strict endpoint's first delivery fails twice (retried after 5 s, then 10 s); the
    # none endpoint's first fails three times (35 s of retries), every other one succeeds
    h.script(strict, statuses=[503, 503, 200])
    h.script(loose, statuses=[503, 503, 503, 200], per_delivery=True, first_ids=1)
    h.start_stages()
    for _ in range(N):  # spaced, so each endpoint's deliveries have a clear order
        h.emit("strict", 1)
        h.emit("loose", 1)
        time.sleep(0.2)
    order = _fanout_order(settings, strict, 2 * N)
    loose_order = _fanout_order(settings, loose, 2 * N)
    assert len(order) == len(loose_order) == N

    # the none endpoint: the others are delivered while its first waits out its retries,
    # so they are all in before its 200
    wait_for(lambda: {k for k, s, _ in _requests(h, loose) if s == 200} >= set(loose_order[1:]),
             30, what="the none endpoint's later deliveries")
    assert not [1 for k, s, _ in _requests(h, loose) if k == loose_order[0] and s == 200], \
        "the none endpoint's later deliveries waited for its first"
    # the strict head has failed once (its attempt committed) and waits in the 5-s tier;
    # nothing behind it has been sent. Kill the agent now and start another.
    wait_for(lambda: h.scalar("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = %s"
                              " AND result = 'retryable'", (strict,)) >= 1, 60,
             what="the strict head's first attempt in PostgreSQL")
    assert {k for k, _, _ in _requests(h, strict)} == {order[0]}
    h.stack.procs["agent"].kill9()
    h.stack.start("agent", "agent")
    h.wait_status(strict, "delivered", N, timeout=150)
    h.wait_status(loose, "delivered", N, timeout=90)

    reqs = _requests(h, strict)
    # nothing after the head before the head's 200; then one request each, in order
    assert [k for k, _, _ in reqs[:3]] == [order[0]] * 3, reqs
    assert [s for _, s, _ in reqs[:3]] == [503, 503, 200], reqs
    firsts = list(dict.fromkeys(k for k, _, _ in reqs))
    assert firsts == order, (firsts, order)
    delivered = [k for k, s, _ in reqs if s == 200]
    assert delivered == order  # each delivered once, one after another
    # the followers waited without using an attempt: only the head has attempts above 1
    rows = h.scalar("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = %s"
                    " AND attempt_no > 1", (strict,))
    assert rows == 2
    print(f"strict order held across an agent kill: {len(reqs)} requests, the head "
          f"delivered {reqs[2][2] - reqs[0][2]:.1f} s after its first try, then "
          f"{N - 1} followers in order")
