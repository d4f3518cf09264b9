"""Notifier stage: pipeline facts -> operational events (operations.v1) and owner
notifications (deliveries to dispatch.v1).

Inputs: dlq.v1 (dead letters), outcomes.v1 (breaker quarantines, deliveries), the
anomaly control topic (halts tripping) and operations.v1 itself (the kinds other
processes produce: endpoint.disabled / endpoint.enabled). ``postbacks.core.notify``
decides what is an event; a slot row in PostgreSQL (``notifications``, one per endpoint,
kind and UTC hour) decides which event is notified. A claimed event is produced to
operations.v1 (unless it came from there) and, when the endpoint's config names a
``notify_endpoint_id``, sent to that endpoint as a delivery of event type
``operations.<kind>`` through dispatch.v1: the agent renders, signs and retries it like
any postback. Outputs and input offsets go in one Kafka transaction (``run_stage``).
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Message

from postbacks.codec import codec_for
from postbacks.core import notify
from postbacks.core.endpoint import Endpoint
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoint_cache import EndpointCache
from postbacks.db.notifications import NotificationStore, Stopping
from postbacks.errors import ConfigError
from postbacks.kafka.clients import check_broker, make_consumer
from postbacks.kafka.stage import Output, run_stage
from postbacks.kafka.txn import TxnProducer
from postbacks.metrics import NOTIFICATIONS_TOTAL
from postbacks.records import OperationalEventRecord
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["GROUP", "INPUTS", "run_notifier"]

log = logging.getLogger(__name__)

GROUP = "postbacks-notifier"
INPUTS = (TOPICS.dlq.base, TOPICS.outcomes.base, TOPICS.anomaly_control.base,
          TOPICS.operations.base)
_PRUNE_EVERY_S = 60.0


class Notifier:
    """Per record: decide (core), claim the slot (PostgreSQL), emit (Kafka output)."""

    def __init__(self, settings: Settings, cache: EndpointCache, box: SecretBox,
                 stop: threading.Event) -> None:
        if settings.notify_breaker_open_s <= 0:
            raise ConfigError("POSTBACKS_NOTIFY_BREAKER_OPEN_S must be > 0")
        self.cache = cache
        self.db = NotificationStore(settings.database_url, box, stop)
        self.idem_key = settings.idempotency_key.reveal().encode()
        self.watch = notify.BreakerWatch(int(settings.notify_breaker_open_s * 1000))
        self.seen = notify.SeenSlots()
        # this batch's part of that memory, undone when its transaction is aborted (its
        # records are read again, and must be notified again: claim_slot lets the same
        # event claim its slot again)
        self._marked: list[notify.Slot] = []
        self._raised: list[str] = []
        self.pruned_at = 0.0
        self.codecs = {t: codec_for(spec.record) for t, spec in (
            (TOPICS.dlq.base, TOPICS.dlq), (TOPICS.outcomes.base, TOPICS.outcomes),
            (TOPICS.anomaly_control.base, TOPICS.anomaly_control),
            (TOPICS.operations.base, TOPICS.operations))}
        self.bases = {settings.topic(b): b for b in INPUTS}
        self.ops = codec_for("OperationalEvent")
        self.dlv = codec_for("Delivery")

    def handle(self, msg: Message, out: Output, now_ms: int) -> None:
        base = self.bases.get(msg.topic() or "")
        if base is None or msg.value() is None:
            return  # a compaction tombstone on the control topic
        rec = self.codecs[base].decode(msg.value())
        event: OperationalEventRecord | None = None
        relayed = False
        if base == TOPICS.dlq.base:
            event = notify.from_dead_letter(rec, now_ms)  # type: ignore[arg-type]
        elif base == TOPICS.outcomes.base:
            event = self.watch.observe(rec, now_ms)  # type: ignore[arg-type]
            if event is not None:
                self._raised.append(event["endpoint_id"] or "")
        elif base == TOPICS.anomaly_control.base:
            event = notify.from_breaker_state(rec, now_ms)  # type: ignore[arg-type]
        else:
            op: OperationalEventRecord = rec  # type: ignore[assignment]
            if op["kind"] not in notify.OWN_KINDS and op["kind"] in notify.NOTIFIED_KINDS:
                event, relayed = op, True
        self._maybe_prune(now_ms)
        if event is not None:
            self.notify(event, out, now_ms, relayed=relayed)

    def notify(self, event: OperationalEventRecord, out: Output, now_ms: int, *,
               relayed: bool) -> None:
        slot = notify.slot_of(event)
        kind = event["kind"]
        if self.seen.taken(slot) or not self.db.claim(slot, event["event_id"]):
            self.seen.mark(slot)
            NOTIFICATIONS_TOTAL.labels(kind=kind, result="aggregated").inc()
            return
        self.seen.mark(slot)
        self._marked.append(slot)
        subject = self._endpoint(event["endpoint_id"]) if event["endpoint_id"] else None
        if subject is not None and not event["app_id"]:
            event = OperationalEventRecord(**{**event, "app_id": subject.app_id})
        if not relayed:
            key = (event["endpoint_id"] or notify.GLOBAL).encode()
            out.add(TOPICS.operations.base, key, self.ops.encode(event))
        target_id = subject.config.notify_endpoint_id if subject is not None else None
        target = self._endpoint(target_id) if target_id else None
        if subject is None or target is None or not target.enabled:
            if target_id:
                log.warning("notifier: %s of %s: notify endpoint %s is unknown or disabled",
                            kind, event["endpoint_id"], target_id)
            NOTIFICATIONS_TOTAL.labels(kind=kind, result="no_owner").inc()
            return
        d = notify.plan_notification(event, subject.app_id, target, idem_key=self.idem_key,
                                     now_ms=now_ms)
        out.add(TOPICS.dispatch.base, target.endpoint_id.encode(), self.dlv.encode(d))
        NOTIFICATIONS_TOTAL.labels(kind=kind, result="sent").inc()
        log.info("notifier: %s of %s -> %s (%s)", kind, event["endpoint_id"],
                 target.endpoint_id, d["delivery_id"])

    def after_commit(self, committed: bool) -> None:
        """After each batch's transaction: aborted, its notifications were not produced."""
        if not committed:
            self.seen.forget(self._marked)
            self.watch.unraise(self._raised)
        self._marked.clear()
        self._raised.clear()

    def _endpoint(self, endpoint_id: str) -> Endpoint | None:
        hit = self.cache.get(endpoint_id)
        if hit is not None:
            return hit
        return self.db.endpoint(endpoint_id)

    def _maybe_prune(self, now_ms: int) -> None:
        if time.monotonic() - self.pruned_at >= _PRUNE_EVERY_S:
            self.pruned_at = time.monotonic()
            self.watch.prune(now_ms)
            self.seen.prune(now_ms)

    def close(self) -> None:
        self.db.close()


def run_notifier(settings: Settings, stop: threading.Event) -> None:
    check_broker(settings)
    box = SecretBox(settings.secrets_key.reveal())
    cache = EndpointCache(settings.database_url, box, settings.config_refresh_s)
    cache.start()
    notifier = Notifier(settings, cache, box, stop)
    consumer = make_consumer(settings, GROUP)
    producer = TxnProducer.create(settings, "notifier")
    try:
        run_stage("notifier", settings, consumer, producer, list(INPUTS), notifier.handle,
                  stop, group=GROUP, after_commit=notifier.after_commit)
    except Stopping:
        log.info("notifier: stopped while waiting for PostgreSQL")
    finally:
        notifier.close()
        cache.stop()
