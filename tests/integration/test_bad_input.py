"""Bad input on conversions.v1: a DeadLetter with the reason and the original bytes, the
partition keeps flowing, the process keeps running."""

from __future__ import annotations

import io
import time

import fastavro

from postbacks.codec import MAGIC, codec_for, load_schema_versions
from postbacks.emit import ConversionProducer
from postbacks.settings import Settings
from postbacks.tools.procs import Stack
from postbacks.tools.seed import app_id_for, seed_endpoints
from tests.kafka_util import decode, read_topic
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS


def test_bad_events_are_dead_lettered_and_the_partition_keeps_flowing(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    seed_endpoints(settings, apps=1, endpoints_per_app=1, receiver_url="http://127.0.0.1:9",
                   namespace=namespace, now_ms=int(time.time() * 1000))
    app = app_id_for(namespace, 1)
    garbage = b"\x00\xffnot avro"
    wrong_record = codec_for("Delivery").encode(make_delivery())
    missing = codec_for("ConversionEvent").encode(make_conversion(app_id="", conversion_id="cvX"))
    too_long = _older_writer_with_a_long_beyond_64_bits()
    producer = ConversionProducer(settings)
    key = b"same-key"  # same key -> same partition: the good event sits behind the bad ones
    for value in (garbage, wrong_record, missing, too_long):
        producer.send_raw(value, key)
    producer.send_raw(codec_for("ConversionEvent").encode(
        make_conversion(app_id=app, conversion_id="cv_good")), key)
    assert producer.flush() == 0

    fanout = stack.start("fanout", "fanout")
    dead = [decode("DeadLetter", m) for m in read_topic(settings, TOPICS.dlq.base, 4)]
    deliveries = [decode("Delivery", m) for m in read_topic(settings, TOPICS.deliveries.base, 1)]

    assert [d["reason"] for d in dead] == ["undecodable", "undecodable", "missing_field",
                                           "undecodable"]
    assert [d["original_value"] for d in dead] == [garbage, wrong_record, missing, too_long]
    assert "does not fit an Avro long" in dead[3]["error_message"]
    assert all(d["original_key"] == key and d["stage"] == "fanout" for d in dead)
    assert all(d["origin_topic"] == settings.topic(TOPICS.conversions.base) for d in dead)
    assert "app_id" in dead[2]["error_message"]
    assert [d["conversion"]["conversion_id"] for d in deliveries] == ["cv_good"]
    assert fanout.alive()


def _older_writer_with_a_long_beyond_64_bits() -> bytes:
    """A ConversionEvent of the older writer version whose occurred_at is 2^63: fastavro
    alone would read it wrapped; the codec reads it with the writer's schema first."""
    old = load_schema_versions()["ConversionEvent"][0]
    datum = {k: v for k, v in make_conversion(occurred_at=7).items()
             if k in {f["name"] for f in old.parsed["fields"]}}

    def body(occurred_at: int) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, old.parsed, {**datum, "occurred_at": occurred_at})
        return buf.getvalue()

    good, other = body(7), body(8)
    at = next(i for i, (a, b) in enumerate(zip(good, other, strict=True)) if a != b)
    beyond = b"\x80" * 9 + b"\x02"  # zig-zag 2^64: the long 2^63
    return MAGIC + old.fingerprint.to_bytes(8, "little") + good[:at] + beyond + good[at + 1:]
