"""A delivery record from a foreign producer, well formed but with an ``attempt`` near
2**31, on each topic a stage reads deliveries from: the gate (deliveries.v1), the agent
(dispatch.v1) and the relay (a retry tier). Its outcome's ``attempt_no`` (attempt + 1)
does not fit an Avro int: the gate restarted in place on it for ever (its partition
stalled), and the agent's process died. Each stage now dead-letters it as
``invalid_record``, naming the field, and the good delivery behind it on the same
partition goes on."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.settings import Settings
from postbacks.tools.procs import Stack
from postbacks.tools.seed import seed_endpoints
from tests.kafka_util import decode, read_topic
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

_DLV = codec_for("Delivery")


def test_an_attempt_past_an_avro_int_is_dead_lettered_by_gate_agent_and_relay(
        settings: Settings, stack: Stack, namespace: str) -> None:
    now = int(time.time() * 1000)
    (ep,) = seed_endpoints(settings, apps=1, endpoints_per_app=1,
                           receiver_url="http://127.0.0.1:9", namespace=namespace, now_ms=now)

    def delivery(dlv_id: str, **over: Any) -> bytes:
        conv = make_conversion(app_id=ep.app_id, conversion_id=f"cv_{dlv_id}",
                               occurred_at=now - 1000)
        return _DLV.encode(make_delivery(
            delivery_id=dlv_id, endpoint_id=ep.endpoint_id, idempotency_key=f"msg_{dlv_id}",
            conversion=conv, created_at=now - 1000, enqueued_at=now - 1000, **over))

    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "enable.idempotence": True, "partitioner": "murmur2_random"})
    key = ep.endpoint_id.encode()  # as fan-out keys it: the gate checks the placement
    inputs = {"gate": TOPICS.deliveries.base, "agent": TOPICS.dispatch.base,
              "relay": TOPICS.retry_tier("5s").base}
    for stage, base in inputs.items():
        extra: dict[str, Any] = {"due_at": now - 500} if stage == "relay" else {}
        producer.produce(settings.topic(base), delivery(f"dlv_bad_{stage}", attempt=2**31 - 1,
                                                        **extra), key)
        producer.produce(settings.topic(base), delivery(f"dlv_good_{stage}", **extra), key)
    assert producer.flush(30) == 0

    for stage in inputs:
        stack.start(stage, stage)
    dead = [decode("DeadLetter", m) for m in read_topic(settings, TOPICS.dlq.base, 3, 90)]
    assert sorted((d["stage"], d["reason"]) for d in dead) == [
        ("agent", "invalid_record"), ("gate", "invalid_record"), ("relay", "invalid_record")]
    assert all("attempt 2147483647" in d["error_message"] for d in dead), dead
    assert sorted(d["origin_topic"] for d in dead) == sorted(
        settings.topic(b) for b in inputs.values())

    # every good delivery behind a bad one reached the agent and has its outcome (the
    # receiver refuses connections: a retry), each partition flowing
    want = {f"dlv_good_{s}" for s in inputs}
    got = read_topic(settings, TOPICS.outcomes.base, len(want), 90)
    seen = {decode("Outcome", m)["delivery_id"] for m in got}
    assert want <= seen, f"outcomes seen: {sorted(seen)}"
    assert not {i for i in seen if i.startswith("dlv_bad_")}
    for stage in inputs:
        proc = stack.procs[stage]
        assert proc.alive(), proc.tail(60)
        assert "restarting in place" not in proc.tail(4000), proc.tail(60)
