"""The upstream producer helper, and synthetic conversions for demos and tests.

``ConversionProducer.send()`` validates, encodes (Avro) and produces one ConversionEvent
keyed by ``conversion_id`` (its times may be given as epoch milliseconds or as ISO-8601
strings with an offset; anything else is refused naming the field) with an idempotent,
``acks=all`` producer: the delivery report
(``flush()``) means the event is durable on the broker and will be delivered, held,
suppressed or dead-lettered — never lost.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any, cast

from confluent_kafka import KafkaError, Message

from postbacks.codec import codec_for
from postbacks.core.fanout import REQUIRED_FIELDS, check_conversion, validate_conversion
from postbacks.core.field_types import type_problems
from postbacks.errors import InvalidRecord
from postbacks.ids import new_id
from postbacks.kafka.clients import make_producer
from postbacks.kafka.stage import DELIVERY_HEADROOM, message_max
from postbacks.records import ConversionEvent
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["TIME_FIELDS", "ConversionProducer", "synthetic_conversions", "with_instants"]

TIME_FIELDS = ("occurred_at", "source_created_at", "source_completed_at")


def with_instants(event: ConversionEvent) -> ConversionEvent:
    """``event`` with ISO-8601 times (or digit strings) as epoch ms; InvalidRecord names a
    time field that is neither."""
    from postbacks.core.instants import InstantError, parse_instant

    bad = [f for f in TIME_FIELDS if isinstance(event.get(f), str)]
    if not bad:
        return event
    out = dict(event)
    for f in bad:
        try:
            out[f] = parse_instant(out[f], f)
        except InstantError as exc:
            raise InvalidRecord(f"conversion {event.get('conversion_id')!r}: {exc}",
                                reason="invalid_field") from None
    return cast(ConversionEvent, out)


class ConversionProducer:
    def __init__(self, settings: Settings) -> None:
        self._producer = make_producer(settings, **{"client.id": "postbacks-emit"})
        self._topic = settings.topic(TOPICS.conversions.base)
        self._codec = codec_for("ConversionEvent")
        self._fields: list[dict[str, Any]] = self._codec.writer.schema["fields"]
        # the fan-out's room for a delivery, less what a delivery adds around its conversion
        self._max_bytes = message_max(settings, "fanout") - DELIVERY_HEADROOM - 4096
        self.acked = 0
        self.failed: list[str] = []

    def _report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failed.append(str(err))

    def send(self, event: ConversionEvent) -> None:
        """Validate and enqueue; raises InvalidRecord before producing an event the fan-out
        would dead-letter (the same checks: every field's type, missing fields, every field
        a later stage cannot handle, and its size)."""
        event = with_instants(event)
        wrong = type_problems(event, self._fields, skip_missing=REQUIRED_FIELDS)
        if wrong:
            raise InvalidRecord(f"conversion {event.get('conversion_id')!r}: "
                                + "; ".join(wrong), reason="invalid_field")
        validate_conversion(event)
        check_conversion(event, int(time.time() * 1000))
        try:
            value = self._codec.encode(event)
        except (ValueError, UnicodeError) as exc:  # a lone surrogate: no UTF-8 to write
            raise InvalidRecord(f"conversion {event.get('conversion_id')!r}: it cannot be "
                                f"encoded: {exc}", reason="invalid_field") from None
        if len(value) > self._max_bytes:
            raise InvalidRecord(f"conversion {event['conversion_id']!r}: {len(value):,} bytes "
                                f"encoded, over the {self._max_bytes:,} its delivery leaves "
                                "it (source_snapshot is the usual culprit)", reason="too_large")
        while True:
            try:
                self._producer.produce(
                    self._topic, value, event["conversion_id"].encode(), on_delivery=self._report
                )
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def send_raw(self, value: bytes, key: bytes | None = None) -> None:
        """Produce bytes as they are (tests: garbage on the input topic)."""
        self._producer.produce(self._topic, value, key, on_delivery=self._report)

    def flush(self, timeout: float = 60.0) -> int:
        """Wait for every delivery report; returns the number still unacknowledged."""
        return int(self._producer.flush(timeout))


def synthetic_conversions(
    count: int, *, apps: int, seed: int, now_ms: int, namespace: str = "demo",
    event_types: tuple[str, ...] = ("conversion",),
) -> Iterator[ConversionEvent]:
    """Deterministic (per seed) conversions over ``apps`` apps (``app_<namespace>_0001`` ...)."""
    rng = random.Random(seed)
    for i in range(count):
        app = f"app_{namespace}_{rng.randrange(apps) + 1:04d}"
        completed = now_ms - rng.randrange(60_000, 3_600_000)
        payout = rng.choice([50_000, 100_000, 250_000, 1_000_000, 2_500_000])
        snapshot: dict[str, Any] = {
            "player_id": f"p{rng.randrange(10**6)}", "offer_id": str(rng.randrange(1000)),
            "amount": f"{payout / 1e6:.2f}", "currency": "USD",
        }
        yield ConversionEvent(
            event_id=new_id("evt", now_ms),
            conversion_id=f"cv_{namespace}_{seed}_{i:08d}",
            app_id=app,
            event_type=rng.choice(event_types),
            goal_id=None,
            payout_usd_micros=payout,
            source_created_at=completed + rng.randrange(1000, 60_000),
            source_completed_at=completed,
            occurred_at=now_ms,
            source_snapshot={k: str(v) for k, v in snapshot.items()},
            original_amount=None,
            original_currency=None,
            producer="postbacks-emit",
        )
