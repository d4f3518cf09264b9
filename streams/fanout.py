"""Fan-out stage: conversions.v1 -> deliveries.v1, one delivery per subscribed endpoint,
re-keyed by endpoint_id. Bad events (undecodable, missing fields) -> dlq.v1."""

from __future__ import annotations

import threading

from confluent_kafka import Message

from postbacks.codec import codec_for
from postbacks.core.fanout import plan_deliveries, validate_conversion
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoint_cache import EndpointCache
from postbacks.kafka.clients import check_broker, make_consumer
from postbacks.kafka.stage import Output, run_stage
from postbacks.kafka.txn import TxnProducer
from postbacks.records import ConversionEvent
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["run_fanout"]

GROUP = "postbacks-fanout"


def run_fanout(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    cache = EndpointCache(
        settings.database_url, SecretBox(settings.secrets_key.reveal()), settings.config_refresh_s
    )
    cache.start()
    conv_codec = codec_for("ConversionEvent")
    dlv_codec = codec_for("Delivery")
    idem_key = settings.idempotency_key.reveal().encode()

    def handle(msg: Message, out: Output, now_ms: int) -> None:
        event: ConversionEvent = conv_codec.decode(msg.value())  # type: ignore[assignment]
        validate_conversion(event)
        for d in plan_deliveries(
            event, cache.for_app(event["app_id"]), idem_key=idem_key, now_ms=now_ms
        ):
            out.add(TOPICS.deliveries.base, d["endpoint_id"].encode(), dlv_codec.encode(d))

    consumer = make_consumer(settings, GROUP)
    producer = TxnProducer.create(settings, "fanout")
    try:
        run_stage("fanout", settings, consumer, producer, [TOPICS.conversions.base], handle, stop,
                  group=GROUP)
    finally:
        cache.stop()
