"""Fan-out stage: conversions.v1 -> deliveries.v1, one delivery per subscribed endpoint,
re-keyed by endpoint_id. Bad events (undecodable, missing fields) -> dlq.v1.

Beyond :func:`~postbacks.core.fanout.validate_conversion`, a conversion is dead-lettered
here (reason ``invalid_record``, the field named) when a later stage could not handle it:
a NUL character in any string (PostgreSQL text and jsonb cannot hold one: the sink failed
on the row after every restart), an id longer than :data:`MAX_ID_CHARS` (the sink's
conversion_id index refuses a long incompressible key), an event type that is not one of
:data:`~postbacks.core.event_types.EVENT_TYPES` (endpoints can subscribe only to those, so
it silently reached none of them), a payout over :data:`MAX_PAYOUT_MICROS` (the gate's
per-minute sums overflowed their Avro long and it restarted without end), or an
``occurred_at`` before 2000 (epoch seconds where milliseconds belong) or more than
:data:`MAX_FUTURE_MS` ahead of the clock (it moved the gate's event-time windows far into
the future, where every later payout of the partition was counted).

A conversion whose delivery would not fit the stages' producers (less a margin for what
later stages add to it) is dead-lettered as ``too_large``; it used to fail the whole
transaction and restart the process on it for ever. A dead letter that itself would not
fit keeps only the first bytes of the original value (and key), and says so.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Message

from postbacks.codec import codec_for
from postbacks.core.event_types import EVENT_TYPES
from postbacks.core.fanout import plan_deliveries, validate_conversion
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoint_cache import EndpointCache
from postbacks.errors import DeadLetterError, InvalidRecord
from postbacks.kafka.clients import check_broker, make_consumer, transactional_config
from postbacks.kafka.stage import Output, dead_letter_for, run_stage
from postbacks.kafka.txn import TxnProducer
from postbacks.metrics import DLQ_TOTAL
from postbacks.records import ConversionEvent
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["MAX_FUTURE_MS", "MAX_ID_CHARS", "MAX_PAYOUT_MICROS", "MIN_OCCURRED_AT_MS",
           "TOO_LARGE", "check_conversion", "run_fanout"]

log = logging.getLogger(__name__)

GROUP = "postbacks-fanout"

MAX_ID_CHARS = 200  # event_id, conversion_id, app_id, goal_id (as the backfill import)
MAX_PAYOUT_MICROS = 10**12  # USD 1,000,000 for one conversion
MIN_OCCURRED_AT_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
MAX_FUTURE_MS = 3_600_000  # occurred_at at most 1 h ahead of the fan-out's clock
TOO_LARGE = "too_large"
_LIBRDKAFKA_MESSAGE_MAX = 1_000_000  # message.max.bytes when the config does not set it
_HEADROOM = 65_536  # what later stages add to a delivery (hold reason, errors, override)
_DLQ_SLACK = 512  # per-message and length-prefix overhead around a dead letter's bytes
_IDS = ("event_id", "conversion_id", "app_id", "goal_id")
_TEXTS = ("event_id", "conversion_id", "app_id", "event_type", "goal_id", "original_amount",
          "original_currency", "producer")


def _shown(value: str) -> str:
    text = repr(value)  # NUL and control characters escaped
    return text if len(text) <= 60 else text[:57] + "..."


def check_conversion(event: ConversionEvent, now_ms: int) -> None:
    """Raise :class:`InvalidRecord` (reason ``invalid_record``) naming every field of
    ``event`` that a later stage cannot handle (see the module docstring); pure."""
    problems: list[str] = []
    for f in _TEXTS:
        v = event.get(f)
        if isinstance(v, str) and "\x00" in v:
            problems.append(f"{f} holds a NUL character")
    snapshot = event.get("source_snapshot") or {}
    bad = [k for k, v in snapshot.items() if "\x00" in k or "\x00" in v]
    if bad:
        problems.append(f"source_snapshot {', '.join(_shown(k) for k in bad[:3])}"
                        f"{' ...' if len(bad) > 3 else ''} hold(s) a NUL character")
    for f in _IDS:
        v = event.get(f)
        if isinstance(v, str) and len(v) > MAX_ID_CHARS:
            problems.append(f"{f} is {len(v):,} characters long (at most {MAX_ID_CHARS})")
    event_type = event.get("event_type")
    if event_type not in EVENT_TYPES:
        problems.append(f"event_type {_shown(str(event_type))} is not a known event type "
                        f"(known: {', '.join(sorted(EVENT_TYPES))})")
    payout = event.get("payout_usd_micros")
    if isinstance(payout, int) and payout > MAX_PAYOUT_MICROS:
        problems.append(f"payout_usd_micros {payout} is over {MAX_PAYOUT_MICROS} "
                        "(USD 1,000,000 for one conversion)")
    at = event.get("occurred_at")
    if isinstance(at, int) and 0 < at < MIN_OCCURRED_AT_MS:
        problems.append(f"occurred_at {at} is before 2000-01-01T00:00:00Z: epoch seconds "
                        "where epoch milliseconds are expected?")
    elif isinstance(at, int) and at > now_ms + MAX_FUTURE_MS:
        problems.append(f"occurred_at {at} is more than {MAX_FUTURE_MS // 60_000} minutes "
                        f"ahead of the clock ({now_ms}): epoch microseconds or nanoseconds "
                        "where epoch milliseconds are expected, or a wrong clock?")
    if problems:
        raise InvalidRecord(f"conversion {_shown(str(event.get('conversion_id')))}: "
                            + "; ".join(problems), reason="invalid_record")


def run_fanout(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    cache = EndpointCache(
        settings.database_url, SecretBox(settings.secrets_key.reveal()), settings.config_refresh_s
    )
    cache.start()
    conv_codec = codec_for("ConversionEvent")
    dlv_codec = codec_for("Delivery")
    dlq_codec = codec_for("DeadLetter")
    idem_key = settings.idempotency_key.reveal().encode()
    # What one message of the stage's producer may hold (librdkafka refuses more with
    # MSG_SIZE_TOO_LARGE, which aborts the whole batch), and what a delivery may hold.
    message_max = int(transactional_config(settings, "fanout").get(
        "message.max.bytes", _LIBRDKAFKA_MESSAGE_MAX))
    delivery_max = message_max - _HEADROOM

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
                    f"conversion {_shown(event['conversion_id'])}: its delivery is "
                    f"{len(key) + len(value):,} bytes, over the {delivery_max:,} a delivery"
                    f" may take (the record is {len(msg.value() or b''):,} bytes)",
                    reason=TOO_LARGE)
            planned.append((key, value))
        for key, value in planned:  # all or none of the record's deliveries
            out.add(TOPICS.deliveries.base, key, value)

    def fits(msg: Message) -> bool:
        """Whether the stage runner's dead letter of ``msg`` (its key, and its key and
        value inside) fits one message, with an error message of at most 2,000 chars."""
        k, v = len(msg.key() or b""), len(msg.value() or b"")
        return 2 * k + v + 8_000 + _DLQ_SLACK <= message_max

    def dead_letter_cut(msg: Message, out: Output, exc: Exception, reason: str,
                        now_ms: int) -> None:
        """A dead letter keeping as much of the original key and value as fits."""
        key, value = msg.key() or b"", msg.value() or b""
        dl = dead_letter_for(msg, "fanout", exc, reason, now_ms)
        kept_key = key[:1024]
        note = (f"original bytes cut to fit a dead letter: value {len(value):,} bytes, key "
                f"{len(key):,} bytes; original_value and original_key hold their first "
                "bytes only. ")
        dl["error_message"] = (note + dl["error_message"])[:2000]
        dl["original_key"] = kept_key if msg.key() is not None else None
        dl["original_value"] = b"" if msg.value() is not None else None
        room = message_max - len(kept_key) - len(dlq_codec.encode(dl)) - _DLQ_SLACK
        if msg.value() is not None:
            dl["original_value"] = value[:max(room, 0)]
        out.add(TOPICS.dlq.base, kept_key if msg.key() is not None else None,
                dlq_codec.encode(dl))
        DLQ_TOTAL.labels(stage="fanout", reason=reason).inc()
        log.warning("fanout: dead-lettered %s[%s]@%s (original bytes cut): %s", msg.topic(),
                    msg.partition(), msg.offset(), exc)

    def handle(msg: Message, out: Output, now_ms: int) -> None:
        try:
            fan_out(msg, out, now_ms)
        except DeadLetterError as exc:
            if fits(msg):
                raise  # the stage runner dead-letters it, original bytes whole
            dead_letter_cut(msg, out, exc, exc.reason, now_ms)
        except Exception as exc:  # a defect: as the stage runner does, but so that it fits
            if fits(msg):
                raise
            log.exception("fanout: unexpected error on %s@%s", msg.topic(), msg.offset())
            dead_letter_cut(msg, out, exc, "internal_error", now_ms)

    consumer = make_consumer(settings, GROUP)
    producer = TxnProducer.create(settings, "fanout")
    try:
        run_stage("fanout", settings, consumer, producer, [TOPICS.conversions.base], handle, stop,
                  group=GROUP)
    finally:
        cache.stop()
