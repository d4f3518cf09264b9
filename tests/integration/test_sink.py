"""The PostgreSQL sink: rows and offsets in one transaction, idempotent, survives kill -9."""

from __future__ import annotations

from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.kafka_util import scalar
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS


def _produce(settings: Settings, n: int, namespace: str) -> int:
    """n deliveries, each with one attempt and one outcome; plus duplicates and garbage."""
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers, "linger.ms": 20,
                  "enable.idempotence": True})  # in order, even across a retried batch
    dc, ac, oc = codec_for("Delivery"), codec_for("Attempt"), codec_for("Outcome")
    sent = 0
    for i in range(n):
        ep = f"ep_{namespace}_{i % 7}"
        d = make_delivery(delivery_id=f"dlv_{namespace}_{i}", endpoint_id=ep,
                          conversion=make_conversion(conversion_id=f"cv_{namespace}_{i}"))
        a = make_attempt(d, now_ms=1_700_000_000_000 + i, result="delivered", req=None)
        o = make_outcome(d, "delivered", now_ms=1_700_000_000_500 + i)
        copies = 2 if i % 10 == 0 else 1  # every 10th is produced twice (replayed input)
        for _ in range(copies):
            p.produce(settings.topic(TOPICS.deliveries.base), dc.encode(d), ep.encode())
            p.produce(settings.topic(TOPICS.attempts.base), ac.encode(a), ep.encode())
            p.produce(settings.topic(TOPICS.outcomes.base), oc.encode(o), ep.encode())
            sent += 3
        if i % 1000 == 0:
            p.poll(0)
    p.produce(settings.topic(TOPICS.attempts.base), b"\x01garbage", b"k")
    sent += 1
    assert p.flush(60) == 0
    return sent


def test_sink_is_exactly_once_through_kill_9(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    n = 20_000
    sent = _produce(settings, n, namespace)
    like = f"ep_{namespace}_%"
    count = "SELECT count(*) FROM {} WHERE endpoint_id LIKE %s"

    sink = stack.start("sink", "sink")
    wait_for(lambda: scalar(settings, count.format("delivery_attempts"), (like,)) > 0, 90,
             interval=0.05, what="the first sunk rows")
    sink.kill9()
    partial = scalar(settings, count.format("delivery_attempts"), (like,))
    stack.start("sink2", "sink")
    wait_for(lambda: scalar(settings, count.format("delivery_attempts"), (like,)) == n, 120,
             what="every attempt row")
    wait_for(lambda: scalar(settings, "SELECT coalesce(sum(next_offset), 0) FROM sink_offsets"
                            " WHERE consumer_group = %s", (settings.topic("postbacks-sink"),))
             == sent, 60, what="stored offsets to cover every message")

    assert scalar(settings, count.format("deliveries"), (like,)) == n
    assert scalar(settings, count.format("delivery_outcomes"), (like,)) == n
    assert scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id LIKE %s"
                  " AND status = 'delivered' AND attempt_count = 1", (like,)) == n
    bad = scalar(settings, "SELECT count(*) FROM dead_letters WHERE stage = 'sink'"
                 " AND origin_topic = %s AND original_value = %s",
                 (settings.topic(TOPICS.attempts.base), b"\x01garbage"))
    assert bad == 1
    print(f"rows before kill -9: {partial} of {n}")
