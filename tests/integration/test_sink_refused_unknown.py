"""A refusal the sink's check does not know: a constraint an operator added to a table the
sink writes. The batch holding the refused row fails, fails again when read back with every
row checked, and is then read once more with each row tried on its own: the refused row
becomes a dead-letter row carrying PostgreSQL's message, and every other row is written.
Before, the sink retried that batch for ever and its partitions stalled."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.kafka_util import scalar
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

T0 = 1_700_000_000_000


@pytest.fixture()
def poison_constraint(settings: Settings, namespace: str) -> Iterator[str]:
    """A CHECK on delivery_outcomes refusing one reason (this test's own)."""
    reason = f"poison {namespace}"
    name = f"test_poison_{namespace}"
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE delivery_outcomes ADD CONSTRAINT {name}"
                     f" CHECK (reason IS DISTINCT FROM '{reason}')")
    try:
        yield reason
    finally:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE delivery_outcomes DROP CONSTRAINT IF EXISTS {name}")


def test_a_row_refused_for_a_reason_no_check_knows_is_dead_lettered_and_the_rest_written(
        settings: Settings, stack: Stack, namespace: str, poison_constraint: str) -> None:
    dc, ac, oc = (codec_for(r) for r in ("Delivery", "Attempt", "Outcome"))
    ep = f"ep_{namespace}"  # one key: every record on one partition of its topic
    topic = {b: settings.topic(b) for b in (TOPICS.deliveries.base, TOPICS.attempts.base,
                                           TOPICS.outcomes.base, TOPICS.dlq.base)}
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "linger.ms": 20,
                  "enable.idempotence": True})
    n = 30
    for i in range(n):
        d = make_delivery(delivery_id=f"dlv_{namespace}_{i}", endpoint_id=ep,
                          conversion=make_conversion(conversion_id=f"cv_{namespace}_{i}"))
        p.produce(topic[TOPICS.deliveries.base], dc.encode(d), ep.encode())
        p.produce(topic[TOPICS.attempts.base], ac.encode(make_attempt(
            d, now_ms=T0 + i, result="delivered", req=None)), ep.encode())
        p.produce(topic[TOPICS.outcomes.base], oc.encode(make_outcome(
            d, "delivered", now_ms=T0 + 500 + i)), ep.encode())
        if i == 12:  # an outcome of another delivery, whose reason the constraint refuses
            x = make_delivery(delivery_id=f"dlv_{namespace}_x", endpoint_id=ep)
            p.produce(topic[TOPICS.outcomes.base], oc.encode(make_outcome(
                x, "failing", now_ms=T0 + 700, reason=poison_constraint)), ep.encode())
    assert p.flush(60) == 0

    sink = stack.start("sink", "sink")
    dead = ("SELECT error_message FROM dead_letters WHERE stage = 'sink'"
            " AND reason = 'invalid_record' AND origin_topic = %s")

    def stored() -> tuple[int, int, int, int]:
        return (
            int(scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = %s"
                       " AND status = 'delivered'", (ep,))),
            int(scalar(settings, "SELECT count(*) FROM delivery_attempts WHERE endpoint_id"
                       " = %s", (ep,))),
            int(scalar(settings, "SELECT count(*) FROM delivery_outcomes WHERE endpoint_id"
                       " = %s", (ep,))),
            int(scalar(settings, dead.replace("error_message", "count(*)"),
                       (topic[TOPICS.outcomes.base],))))

    wait_for(lambda: stored() == (n, n, n, 1), 90,
             what="every good row and a dead letter for the refused one", progress=stored)
    with psycopg.connect(settings.database_url) as conn:
        (message,), = conn.execute(dead, (topic[TOPICS.outcomes.base],)).fetchall()
    assert "outcomes: PostgreSQL refuses the row: CheckViolation" in message, message
    assert f"test_poison_{namespace}" in message, message
    assert sink.alive()
    log = sink.tail(4000)
    assert "reading it again with every row checked" in log, log[-2000:]
    assert "reading it again with each row tried on its own" in log, log[-2000:]
    assert "Traceback" not in log and "ERROR" not in log, log[-2000:]
    page = sink.metrics() or ""
    assert [line for line in page.splitlines() if line.startswith("webhook_dlq_total{")
            and 'stage="sink"' in line and 'reason="invalid_record"' in line
            and line.endswith(" 1.0")], page
