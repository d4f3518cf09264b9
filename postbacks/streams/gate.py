"""Gate stage: deliveries.v1 -> dispatch.v1 (or held.v1).

This is the pass-through gate: every detector reads as ``off`` (a missing
payout_anomaly_settings row is ``off``), so each delivery is cleared to dispatch. The
Faust anomaly gate (retrodating guard, seasonal payout baselines) replaces this runner
without changing its topics.
"""

from __future__ import annotations

import threading

from confluent_kafka import Message

from postbacks.codec import codec_for
from postbacks.kafka.clients import check_broker, make_consumer, make_transactional_producer
from postbacks.kafka.stage import Output, run_stage
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from postbacks.topics import TOPICS

__all__ = ["run_gate"]


def run_gate(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    codec = codec_for("Delivery")

    def handle(msg: Message, out: Output, now_ms: int) -> None:
        d: DeliveryRecord = codec.decode(msg.value())  # type: ignore[assignment]
        d["enqueued_at"] = now_ms
        out.add(TOPICS.dispatch.base, d["endpoint_id"].encode(), codec.encode(d))

    consumer = make_consumer(settings, "postbacks-gate")
    producer = make_transactional_producer(settings, "gate")
    run_stage("gate", settings, consumer, producer, [TOPICS.deliveries.base], handle, stop)
