"""Fan-out stage: conversions.v1 -> deliveries.v1, one delivery per subscribed endpoint,
re-keyed by endpoint_id. Bad events (undecodable, missing fields) -> dlq.v1.

Beyond :func:`~postbacks.core.fanout.validate_conversion`, a conversion is dead-lettered
here (reason ``invalid_record``, the field named; :func:`~postbacks.core.fanout.
check_conversion`, which the producer helper runs too) when a later stage could not handle it:
a NUL character in any string (PostgreSQL text and jsonb cannot hold one: the sink failed
on the row after every restart), an id longer than :data:`MAX_ID_CHARS` (the sink's
conversion_id index refuses a long incompressible key) or holding a control character
(the delivery id and idempotency key join the ids with one: two conversions could share
them), a negative payout, a ``source_created_at`` or ``source_completed_at`` outside
1970..9999 (it cannot be rendered as a date), an event type that is not one of
:data:`~postbacks.core.event_types.EVENT_TYPES` (endpoints can subscribe only to those, so
it silently reached none of them), a payout over :data:`MAX_PAYOUT_MICROS` (the gate's
per-minute sums overflowed their Avro long and it restarted without end), or an
``occurred_at`` before 2000 (epoch seconds where milliseconds belong) or more than
:data:`MAX_FUTURE_MS` ahead of the clock (it moved the gate's event-time windows far into
the future, where every later payout of the partition was counted).

A conversion whose delivery would not fit the stages' producers (less a margin for what
later stages add to it) is dead-lettered as ``too_large``; it used to fail the whole
transaction and restart the process on it for ever. A dead letter that itself would not
fit keeps only the first bytes of the original value (and key), and says so (the stage
runner's :func:`~postbacks.kafka.stage.dead_letter_for`).
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Message

from postbacks.codec import codec_for
from postbacks.core.fanout import (
    MAX_FUTURE_MS,
    MAX_ID_CHARS,
    MAX_PAYOUT_MICROS,
    MIN_OCCURRED_AT_MS,
    ROUTABLE_APP_ID,
    check_conversion,
    plan_deliveries,
    shown,
    validate_conversion,
)
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoint_cache import EndpointCache
from postbacks.errors import DeadLetterError, InvalidRecord
from postbacks.kafka.clients import check_broker, make_consumer
from postbacks.kafka.stage import (
    DELIVERY_HEADROOM,
    OUTPUT_BUDGET,
    Output,
    message_max,
    run_stage,
)
from postbacks.kafka.txn import TxnProducer
from postbacks.metrics import FANOUT_UNROUTED
from postbacks.records import ConversionEvent
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["MAX_FUTURE_MS", "MAX_ID_CHARS", "MAX_PAYOUT_MICROS", "MIN_OCCURRED_AT_MS",
           "TOO_LARGE", "check_conversion", "run_fanout"]

log = logging.getLogger(__name__)

GROUP = "postbacks-fanout"

TOO_LARGE = "too_large"


def run_fanout(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    cache = EndpointCache(
        settings.database_url, SecretBox(settings.secrets_key.reveal()), settings.config_refresh_s
    )
    cache.start()
    conv_codec = codec_for("ConversionEvent")
    dlv_codec = codec_for("Delivery")
    idem_key = settings.idempotency_key.reveal().encode()
    delivery_max = message_max(settings, "fanout") - DELIVERY_HEADROOM  # what a delivery may hold

    def fan_out(msg: Message, out: Output, now_ms: int) -> None:
        event: ConversionEvent = conv_codec.decode(msg.value())  # type: ignore[assignment]
        validate_conversion(event)
        check_conversion(event, now_ms)
        planned = []
        for d in plan_deliveries(
            event, cache.for_app(event["app_id"]), idem_key=idem_key, now_ms=now_ms
        ):
            key, value = d["endpoint_id"].encode(), dlv_codec.encode(d)
            if len(key) + len(value) > delivery_max:
                raise DeadLetterError(
                    f"conversion {shown(event['conversion_id'])}: its delivery is "
                    f"{len(key) + len(value):,} bytes, over the {delivery_max:,} a delivery"
                    f" may take (the record is {len(msg.value() or b''):,} bytes)",
                    reason=TOO_LARGE)
            planned.append((key, value))
        if not planned and not ROUTABLE_APP_ID.fullmatch(event["app_id"]):
            raise InvalidRecord(  # no endpoint can ever have it: an upstream bug, shown
                f"conversion {shown(event['conversion_id'])}: app_id {ascii(event['app_id'])[:80]}"
                " can never match an endpoint (app ids are ASCII letters, digits and _.:-; "
                "a look-alike letter, a space or a slash is an upstream bug)")
        if not planned:  # not an error (an app with no publisher postbacks), but seen:
            FANOUT_UNROUTED.inc()  # a typo in app_id or event_type lands here too
        size = sum(len(k) + len(v) for k, v in planned)
        if size > OUTPUT_BUDGET:  # one transaction holds all of a record's deliveries
            raise DeadLetterError(
                f"conversion {shown(event['conversion_id'])}: its {len(planned)} deliveries "
                f"take {size:,} bytes, over the {OUTPUT_BUDGET:,} one conversion's may take",
                reason=TOO_LARGE)
        for key, value in planned:  # all or none of the record's deliveries
            out.add(TOPICS.deliveries.base, key, value)

    consumer = make_consumer(settings, GROUP)
    producer = TxnProducer.create(settings, "fanout")
    try:
        run_stage("fanout", settings, consumer, producer, [TOPICS.conversions.base], fan_out, stop,
                  group=GROUP)
    finally:
        cache.stop()
