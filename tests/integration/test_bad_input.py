"""Bad input on conversions.v1: a DeadLetter with the reason and the original bytes, the
partition keeps flowing, the process keeps running."""

from __future__ import annotations

import time

from postbacks.codec import codec_for
from postbacks.emit import ConversionProducer
from postbacks.settings import Settings
from postbacks.tools.procs import Stack
from postbacks.tools.seed import app_id_for, seed_endpoints
from postbacks.topics import TOPICS
from tests.kafka_util import decode, read_topic
from tests.unit.factories import make_conversion, make_delivery


def test_bad_events_are_dead_lettered_and_the_partition_keeps_flowing(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    seed_endpoints(settings, apps=1, endpoints_per_app=1, receiver_url="http://127.0.0.1:9",
                   namespace=namespace, now_ms=int(time.time() * 1000))
    app = app_id_for(namespace, 1)
    garbage = b"\x00\xffnot avro"
    wrong_record = codec_for("Delivery").encode(make_delivery())
    missing = codec_for("ConversionEvent").encode(make_conversion(app_id="", conversion_id="cvX"))
    producer = ConversionProducer(settings)
    key = b"same-key"  # same key -> same partition: the good event sits behind the bad ones
    for value in (garbage, wrong_record, missing):
        producer.send_raw(value, key)
    producer.send_raw(codec_for("ConversionEvent").encode(
        make_conversion(app_id=app, conversion_id="cv_good")), key)
    assert producer.flush() == 0

    fanout = stack.start("fanout", "fanout")
    dead = [decode("DeadLetter", m) for m in read_topic(settings, TOPICS.dlq.base, 3)]
    deliveries = [decode("Delivery", m) for m in read_topic(settings, TOPICS.deliveries.base, 1)]

    assert [d["reason"] for d in dead] == ["undecodable", "undecodable", "missing_field"]
    assert [d["original_value"] for d in dead] == [garbage, wrong_record, missing]
    assert all(d["original_key"] == key and d["stage"] == "fanout" for d in dead)
    assert all(d["origin_topic"] == settings.topic(TOPICS.conversions.base) for d in dead)
    assert "app_id" in dead[2]["error_message"]
    assert [d["conversion"]["conversion_id"] for d in deliveries] == ["cv_good"]
    assert fanout.alive()
