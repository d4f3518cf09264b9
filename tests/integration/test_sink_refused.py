"""Records PostgreSQL refuses, reaching the sink from another producer than the stages (which
check their own): a NUL character in a text or jsonb value, a text too long for its
index. Each used to fail the sink's whole batch after every restart (or retry it for ever);
now each becomes a dead-letter row naming the column, and every other row is written."""

from __future__ import annotations

import os

import psycopg
from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_attempt, make_dead_letter, make_outcome
from postbacks.core.providers.base import RenderedRequest
from postbacks.errors import InvalidRecord
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.integration.sink_util import T0, produce_delivered, sink_topics
from tests.kafka_util import scalar
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS


def test_values_postgresql_refuses_are_dead_lettered_and_the_rest_written(
        settings: Settings, stack: Stack, namespace: str) -> None:
    dc, ac, oc, xc = (codec_for(r) for r in ("Delivery", "Attempt", "Outcome", "DeadLetter"))
    ep = f"ep_{namespace}"  # one key: every record on one partition of its topic
    topic = sink_topics(settings)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "linger.ms": 20,
                  "enable.idempotence": True})
    n = 40

    base = make_delivery(delivery_id=f"dlv_{namespace}_x", endpoint_id=ep)
    hostile: list[tuple[str, bytes, str]] = [  # (topic, value, the column named)
        (TOPICS.deliveries.base, dc.encode(make_delivery(
            delivery_id=f"dlv_{namespace}_nul", endpoint_id=ep,
            conversion=make_conversion(conversion_id="cv_nul\x00"))), "conversion_id"),
        (TOPICS.deliveries.base, dc.encode(make_delivery(
            delivery_id=f"dlv_{namespace}_snap", endpoint_id=ep,
            conversion=make_conversion(source_snapshot={"player": "p\x00"}))), "snapshot"),
        (TOPICS.deliveries.base, dc.encode(make_delivery(
            delivery_id=f"dlv_{namespace}_long", endpoint_id=ep,
            conversion=make_conversion(conversion_id="cv_" + os.urandom(1500).hex()))),
         "conversion_id"),
        (TOPICS.attempts.base, ac.encode(make_attempt(
            base, now_ms=T0, result="failed", req=None, error_message="bad\x00")),
         "error_message"),
        (TOPICS.outcomes.base, oc.encode(make_outcome(
            base, "failed", now_ms=T0, reason="r\x00")), "reason"),
        (TOPICS.dlq.base, xc.encode(make_dead_letter(
            topic="x", partition=0, offset=1, key=None, value=b"v", stage="elsewhere",
            exc=InvalidRecord("why\x00"), reason="invalid_record", now_ms=T0)),
         "error_message"),
        # an intent's agent_instance is in the intent's row only: the sink stalled on it
        (TOPICS.attempts.base, ac.encode(make_attempt(
            base, now_ms=T0, result="sending", agent_instance="a\x00b",
            req=RenderedRequest("POST", "https://example.test/h", {}, b"{}"))),
         "agent_instance"),
    ]
    for i in range(n):
        produce_delivered(p, topic, namespace, ep, i)
        if i % 5 == 2 and i // 5 < len(hostile):
            t, value, _ = hostile[i // 5]
            p.produce(topic[t], value, ep.encode())
        if i == 1:  # dead-lettered on the first read, before the refused batch is re-read
            p.produce(topic[TOPICS.attempts.base], b"not avro", ep.encode())
    assert p.flush(60) == 0

    sink = stack.start("sink", "sink")
    dead = ("SELECT origin_topic, error_message FROM dead_letters WHERE stage = 'sink'"
            " AND reason = 'invalid_record' AND origin_topic = ANY(%s)")

    def stored() -> tuple[int, int, int, int]:
        like = (ep,)
        return (
            int(scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = %s",
                       like)),
            int(scalar(settings, "SELECT count(*) FROM delivery_attempts WHERE endpoint_id"
                       " = %s AND result = 'delivered'", like)),
            int(scalar(settings, "SELECT count(*) FROM delivery_outcomes WHERE endpoint_id"
                       " = %s AND kind = 'delivered'", like)),
            int(scalar(settings, dead.replace("origin_topic, error_message", "count(*)"),
                       (list(topic.values()),))))

    wait_for(lambda: stored() == (n, n, n, len(hostile)), 90,
             what="every good row and a dead letter for each refused one", progress=stored)
    with psycopg.connect(settings.database_url) as conn:
        letters = conn.execute(dead, (list(topic.values()),)).fetchall()
    for t, _value, column in hostile:
        assert any(origin == topic[t] and f"{column} " in message
                   for origin, message in letters), (t, column, letters)
    assert scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = %s"
                  " AND status = 'delivered'", (ep,)) == n
    # Values the sink copies into another table's index once the row is stored (the
    # status projection, endpoint health): for deliveries already written, and for one
    # still waiting for its first outcome; each refused on the row itself, as it is read.
    def second(i: int) -> DeliveryRecord:  # delivery i, in its second round
        return make_delivery(delivery_id=f"dlv_{namespace}_{i}", endpoint_id=ep, attempt=1,
                             conversion=make_conversion(conversion_id=f"cv_{namespace}_{i}"))

    long_text = os.urandom(1500).hex()
    late: list[tuple[str, bytes, str]] = [
        (TOPICS.attempts.base, ac.encode(make_attempt(  # -> deliveries.last_error
            second(3), now_ms=T0 + 9_000, result="failed", req=None, error_class=long_text)),
         "error_class"),
        (TOPICS.outcomes.base, oc.encode(make_outcome(  # -> deliveries.status
            second(4), long_text, now_ms=T0 + 9_000)), "kind"),
    ]
    waiting = make_delivery(delivery_id=f"dlv_{namespace}_w", endpoint_id=ep,
                            conversion=make_conversion(conversion_id=f"cv_{namespace}_w"))
    p.produce(topic[TOPICS.deliveries.base], dc.encode(waiting), ep.encode())
    for t, value, _ in late:
        p.produce(topic[t], value, ep.encode())
    p.produce(topic[TOPICS.attempts.base], ac.encode(make_attempt(  # for the waiting row
        waiting, now_ms=T0 + 9_500, result="failed", req=None, error_class=long_text)),
        ep.encode())
    late.append((TOPICS.attempts.base, b"", "error_class"))  # (counted, not produced again)
    p.produce(topic[TOPICS.outcomes.base], oc.encode(make_outcome(
        waiting, "delivered", now_ms=T0 + 9_900)), ep.encode())
    assert p.flush(60) == 0
    hostile += late
    wait_for(lambda: stored() == (n + 1, n, n + 1, len(hostile)), 90,
             what="the late rows and a dead letter for each refused one", progress=stored)
    with psycopg.connect(settings.database_url) as conn:
        letters = conn.execute(dead, (list(topic.values()),)).fetchall()
        statuses = conn.execute("SELECT status, count(*) FROM deliveries WHERE endpoint_id"
                                " = %s GROUP BY 1", (ep,)).fetchall()
    assert sum(1 for origin, message in letters if origin == topic[TOPICS.attempts.base]
               and "error_class " in message) == 2, letters
    assert sum(1 for origin, message in letters if origin == topic[TOPICS.outcomes.base]
               and "kind " in message) == 1, letters
    assert dict(statuses) == {"delivered": n + 1}, statuses
    assert sink.alive()
    log = sink.tail(4000)
    assert "reading it again with every row checked" in log
    assert "Traceback" not in log and "ERROR" not in log, log
    # Each refused row counted once, though its batch was read twice (refused, then
    # checked row by row): the counter moves when the flush holding the letter commits.
    page = sink.metrics() or ""

    def counted(reason: str) -> list[float]:
        return [float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                if line.startswith("webhook_dlq_total{") and 'stage="sink"' in line
                and f'reason="{reason}"' in line]

    assert counted("invalid_record") == [len(hostile)], (counted("invalid_record"), hostile)
    assert counted("undecodable") == [1.0], counted("undecodable")
