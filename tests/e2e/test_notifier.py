"""The notifier against the real broker and PostgreSQL: a flood of dead letters for one
endpoint is one ``dead_letter.first`` event and one signed request at its owner's notify
endpoint in the hour; an anomaly trip is one ``anomaly.tripped`` notification."""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from postbacks.codec import codec_for
from postbacks.kafka.clients import make_producer
from postbacks.settings import Settings
from postbacks.tools.procs import Proc, Stack, wait_for
from tests.e2e.harness import Harness
from tests.kafka_util import decode, read_topic
from topics import TOPICS


@pytest.fixture()
def h(settings: Settings, stack: Stack, namespace: str) -> Harness:
    harness = Harness(settings, stack, namespace)
    harness.start_receiver()
    return harness


def _count(proc: Proc, kind: str, result: str) -> float:
    text = proc.metrics(timeout=3) or ""
    labels = rf'(?=[^}}]*kind="{re.escape(kind)}")(?=[^}}]*result="{result}")'
    m = re.search(rf"^postbacks_notifications_total\{{{labels}[^}}]*\}} ([0-9.e+]+)$", text,
                  re.M)
    return float(m.group(1)) if m else 0.0


def _events(settings: Settings, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Every committed OperationalEvent on operations.v1 up to its current end."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "group.id": "unused", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    topic = settings.topic(TOPICS.operations.base)
    parts = [TopicPartition(topic, p, OFFSET_BEGINNING)
             for p in range(TOPICS.operations.partitions)]
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
    consumer.assign(parts)
    codec = codec_for("OperationalEvent")
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for m in consumer.consume(500, timeout=0.3):
                if m.error() is None:
                    out.append(codec.decode(m.value()))
            pos = {tp.partition: tp.offset for tp in consumer.position(parts)}
            # a transaction's commit marker is the last offset: no record is behind it
            if all(ends[p] == 0 or pos[p] >= ends[p] - 1 for p in ends):
                return out
    finally:
        consumer.close()
    raise AssertionError(f"operations.v1 not read to its end within {timeout}s")


def test_a_dead_letter_flood_is_one_notification_to_the_owner(h: Harness) -> None:
    ops = h.endpoint("ops")
    h.script(ops, statuses=[200])
    pub = h.endpoint("pub", config={"notify_endpoint_id": ops})
    h.script(pub, statuses=[404])  # permanent: each delivery is dead-lettered at once
    h.start_stages({"POSTBACKS_BREAKER_FAILURE_THRESHOLD": "5000"})
    notifier = h.stack.start("notifier", "notifier")
    h.emit("pub", 20)

    wait_for(lambda: h.scalar("SELECT count(*) FROM dead_letters WHERE endpoint_id = %s",
                              (pub,)) == 20, 120, what="20 dead letters of the endpoint")
    wait_for(lambda: _count(notifier, "dead_letter.first", "sent")
             + _count(notifier, "dead_letter.first", "aggregated") == 20, 60,
             what="the notifier to have seen all 20 dead letters")
    wait_for(lambda: [r for r in h.received(ops) if r["status"] == 200], 60,
             what="the owner's notification at the notify endpoint")
    assert _count(notifier, "dead_letter.first", "sent") == 1
    assert _count(notifier, "dead_letter.first", "aggregated") == 19

    firsts = [e for e in _events(h.settings) if e["kind"] == "dead_letter.first"]
    assert len(firsts) == 1, firsts
    ev = firsts[0]
    assert ev["endpoint_id"] == pub and ev["app_id"] == h.app("pub")
    assert ev["detail"]["reason"] == "permanent"
    assert h.scalar("SELECT count(*) FROM dead_letters WHERE dead_letter_id = %s",
                    (ev["detail"]["dead_letter_id"],)) == 1

    got = h.received(ops)
    assert len(got) == 1, got
    assert got[0]["signature"] == "ok" and h.stats()["bad_signatures"] == 0
    body = orjson.loads(got[0]["body"])
    assert body["type"] == "operations.dead_letter.first"
    assert body["data"]["conversion_id"] == ev["event_id"]
    assert h.scalar("SELECT count(*) FROM notifications WHERE endpoint_id = %s"
                    " AND kind = 'dead_letter.first'", (pub,)) == 1
    assert not h.stack.dead(), h.stack.dead()


def test_an_anomaly_trip_is_notified_once(h: Harness) -> None:
    ops = h.endpoint("ops")
    h.script(ops, statuses=[200])
    pub = h.endpoint("pub", config={"notify_endpoint_id": ops})
    h.stack.start("agent", "agent")
    notifier = h.stack.start("notifier", "notifier")
    codec = codec_for("BreakerState")
    producer = make_producer(h.settings)
    now = int(time.time() * 1000)
    # first, on the same partition, a trip whose scope key PostgreSQL cannot hold (a NUL):
    # the notifier waited on it for ever as "PostgreSQL unavailable"; now a dead letter
    producer.produce(h.settings.topic(TOPICS.anomaly_control.base), codec.encode({
        "scope": "endpoint", "scope_key": "ep\x00forged", "detector": "payout_rate",
        "state": "tripped", "changed_at": now, "reason": "r", "actor": None,
        "observed_value": None, "baseline_value": None,
    }), f"endpoint/{pub}/payout_rate".encode())
    for i in range(3):  # the same trip re-published (a compacted topic re-read): one slot
        producer.produce(h.settings.topic(TOPICS.anomaly_control.base), codec.encode({
            "scope": "endpoint", "scope_key": pub, "detector": "payout_rate",
            "state": "tripped", "changed_at": now + i, "reason": "payout 12x the baseline",
            "actor": None, "observed_value": 1200.0, "baseline_value": 100.0,
        }), f"endpoint/{pub}/payout_rate".encode())
    assert producer.flush(30) == 0

    wait_for(lambda: _count(notifier, "anomaly.tripped", "sent")
             + _count(notifier, "anomaly.tripped", "aggregated") == 3, 60,
             what="the notifier to have seen the three trips")
    wait_for(lambda: h.received(ops), 60, what="the trip notification")
    trips = [e for e in _events(h.settings) if e["kind"] == "anomaly.tripped"]
    assert len(trips) == 1 and trips[0]["endpoint_id"] == pub
    assert trips[0]["detail"]["detector"] == "payout_rate"
    got = h.received(ops)
    assert len(got) == 1 and got[0]["signature"] == "ok"
    assert orjson.loads(got[0]["body"])["type"] == "operations.anomaly.tripped"
    [dead] = [decode("DeadLetter", m) for m in read_topic(h.settings, TOPICS.dlq.base, 1)]
    assert (dead["stage"], dead["reason"]) == ("notifier", "invalid_record"), dead
    assert "PostgreSQL refuses a value" in dead["error_message"]
