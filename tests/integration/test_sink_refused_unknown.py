"""Refusals the sink's check does not know: a constraint and a trigger an operator added to
tables the sink writes. The batch holding the refused rows fails, fails again when read back
with every row checked, and is then read once more and written row by row, each in a
savepoint: each refused row becomes a dead-letter row carrying PostgreSQL's message and the
record it came from, and every other row is written. Before, the sink retried that batch
for ever and its partitions stalled."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.integration.sink_util import T0, produce_delivered, sink_topics
from tests.kafka_util import scalar
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS


@pytest.fixture()
def poison_constraint(settings: Settings, namespace: str) -> Iterator[str]:
    """A CHECK on delivery_outcomes refusing one reason, and a trigger on delivery_attempts
    raising on one error message (this test's own)."""
    poison = f"poison {namespace}"
    name = f"test_poison_{namespace}"
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE delivery_outcomes ADD CONSTRAINT {name}"
                     f" CHECK (reason IS DISTINCT FROM '{poison}')")
        conn.execute(f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
                     f" BEGIN IF NEW.error_message = '{poison}' THEN"
                     f" RAISE EXCEPTION 'refused by {name}'; END IF; RETURN NEW; END $$")
        conn.execute(f"CREATE TRIGGER {name} BEFORE INSERT ON delivery_attempts"
                     f" FOR EACH ROW EXECUTE FUNCTION {name}()")
    try:
        yield poison
    finally:
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE delivery_outcomes DROP CONSTRAINT IF EXISTS {name}")
            conn.execute(f"DROP TRIGGER IF EXISTS {name} ON delivery_attempts")
            conn.execute(f"DROP FUNCTION IF EXISTS {name}()")


def test_a_row_refused_for_a_reason_no_check_knows_is_dead_lettered_and_the_rest_written(
        settings: Settings, stack: Stack, namespace: str, poison_constraint: str) -> None:
    dc, ac, oc = (codec_for(r) for r in ("Delivery", "Attempt", "Outcome"))
    ep = f"ep_{namespace}"  # one key: every record on one partition of its topic
    topic = sink_topics(settings)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "linger.ms": 20,
                  "enable.idempotence": True})
    n = 30
    for i in range(n):
        produce_delivered(p, topic, namespace, ep, i)
        if i == 12:  # an outcome of another delivery, whose reason the constraint refuses
            x = make_delivery(delivery_id=f"dlv_{namespace}_x", endpoint_id=ep)
            p.produce(topic[TOPICS.outcomes.base], oc.encode(make_outcome(
                x, "failing", now_ms=T0 + 700, reason=poison_constraint)), ep.encode())
        if i == 25:  # a delivery whose (only) outcome the constraint refuses: its row is
            # written, but not as delivered: the refused outcome must not set its status
            z = make_delivery(delivery_id=f"dlv_{namespace}_z", endpoint_id=ep,
                              conversion=make_conversion(conversion_id=f"cv_{namespace}_z"))
            p.produce(topic[TOPICS.deliveries.base], dc.encode(z), ep.encode())
            p.produce(topic[TOPICS.attempts.base], ac.encode(make_attempt(
                z, now_ms=T0 + 900, result="delivered", req=None)), ep.encode())
            p.produce(topic[TOPICS.outcomes.base], oc.encode(make_outcome(
                z, "delivered", now_ms=T0 + 950, reason=poison_constraint)), ep.encode())
        if i == 20:  # an attempt of another delivery, which the trigger refuses
            y = make_delivery(delivery_id=f"dlv_{namespace}_y", endpoint_id=ep)
            p.produce(topic[TOPICS.attempts.base], ac.encode(make_attempt(
                y, now_ms=T0 + 800, result="failed", req=None,
                error_message=poison_constraint)), ep.encode())
    assert p.flush(60) == 0

    sink = stack.start("sink", "sink")
    dead = ("SELECT origin_topic, error_message, origin_offset, original_value IS NOT NULL,"
            " delivery_id FROM dead_letters WHERE stage = 'sink'"
            " AND reason = 'invalid_record' AND origin_topic = ANY(%s)")
    origins = [topic[TOPICS.outcomes.base], topic[TOPICS.attempts.base]]

    def stored() -> tuple[int, int, int, int]:
        return (
            int(scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = %s"
                       " AND status = 'delivered'", (ep,))),
            int(scalar(settings, "SELECT count(*) FROM delivery_attempts WHERE endpoint_id"
                       " = %s", (ep,))),
            int(scalar(settings, "SELECT count(*) FROM delivery_outcomes WHERE endpoint_id"
                       " = %s", (ep,))),
            int(scalar(settings, "SELECT count(*) FROM dead_letters WHERE stage = 'sink'"
                       " AND reason = 'invalid_record' AND origin_topic = ANY(%s)",
                       (origins,))))

    wait_for(lambda: stored() == (n, n + 1, n, 3), 90,
             what="every good row and a dead letter for each refused one", progress=stored)
    with psycopg.connect(settings.database_url) as conn:
        letters = {t: rest for t, *rest in conn.execute(dead, (origins,)).fetchall()}
    with psycopg.connect(settings.database_url) as conn:
        outcome_letters = conn.execute(
            dead + " AND origin_topic = %s ORDER BY delivery_id",
            (origins, topic[TOPICS.outcomes.base])).fetchall()
        z_status = conn.execute("SELECT status FROM deliveries WHERE delivery_id = %s",
                                (f"dlv_{namespace}_z",)).fetchall()
    assert [x[4] for x in outcome_letters] == [f"dlv_{namespace}_x", f"dlv_{namespace}_z"]
    for _t, message, offset, has_value, _d in outcome_letters:
        assert "outcomes: PostgreSQL refuses the row: CheckViolation" in message, message
        assert f"test_poison_{namespace}" in message, message
        assert offset >= 0 and has_value
    assert z_status and z_status[0][0] != "delivered", z_status
    message, offset, has_value, delivery = letters[topic[TOPICS.attempts.base]]
    assert "attempts: PostgreSQL refuses the row: RaiseException" in message, message
    assert f"refused by test_poison_{namespace}" in message, message
    assert offset >= 0 and has_value and delivery == f"dlv_{namespace}_y"
    assert sink.alive()
    log = sink.tail(4000)
    assert "reading it again with every row checked" in log, log[-2000:]
    assert "reading it again to write it row by row" in log, log[-2000:]
    assert "Traceback" not in log and "ERROR" not in log, log[-2000:]
    page = sink.metrics() or ""
    assert [line for line in page.splitlines() if line.startswith("webhook_dlq_total{")
            and 'stage="sink"' in line and 'reason="invalid_record"' in line
            and line.endswith(" 3.0")], page
