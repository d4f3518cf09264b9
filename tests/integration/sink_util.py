"""Records for the sink's tests, produced as the stages would: a delivery with its attempt
and its outcome, on the endpoint's key."""

from __future__ import annotations

from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.settings import Settings
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

T0 = 1_700_000_000_000


def sink_topics(settings: Settings) -> dict[str, str]:
    """The sink's input topics, by registry base name."""
    return {b: settings.topic(b) for b in (TOPICS.deliveries.base, TOPICS.attempts.base,
                                           TOPICS.outcomes.base, TOPICS.dlq.base)}


def produce_delivered(p: Producer, topic: dict[str, str], namespace: str, ep: str,
                      i: int) -> None:
    """Delivery ``i`` of ``ep``, its ``delivered`` attempt and outcome."""
    d = make_delivery(delivery_id=f"dlv_{namespace}_{i}", endpoint_id=ep,
                      conversion=make_conversion(conversion_id=f"cv_{namespace}_{i}"))
    p.produce(topic[TOPICS.deliveries.base], codec_for("Delivery").encode(d), ep.encode())
    p.produce(topic[TOPICS.attempts.base], codec_for("Attempt").encode(make_attempt(
        d, now_ms=T0 + i, result="delivered", req=None)), ep.encode())
    p.produce(topic[TOPICS.outcomes.base], codec_for("Outcome").encode(make_outcome(
        d, "delivered", now_ms=T0 + 500 + i)), ep.encode())


def delivered_count(database_url: str, ep: str) -> int:
    """Deliveries of ``ep`` whose status is ``delivered`` in the database at that URL."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM deliveries WHERE endpoint_id = %s"
                           " AND status = 'delivered'", (ep,)).fetchone()
    return int(row[0]) if row else 0


def ordered_producer(settings: Settings) -> Producer:
    """A producer keeping order across a retried batch (records of one key land in order)."""
    return Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "linger.ms": 20,
                     "enable.idempotence": True})
