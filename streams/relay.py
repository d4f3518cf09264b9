"""Delay relay: retry.<tier>.v1 and quarantine.v1 -> dispatch.v1 once ``due_at`` has passed.

The relay looks only at a partition's head: when it is not yet ripe, the partition is
**paused** and the records already fetched behind it are kept, in order, in memory (at most
one batch), then released as they ripen; the partition resumes when they are gone. That
needs each partition in ripening order. A retry tier holds delays from its own period to
the next tier's (``retry.1h.v1``: 1 h to 6 h), and several endpoints share a partition, so
a record due in 6 h at the head held one due in 1 h behind it for 5 h. A record in a retry
tier therefore ripens one tier period after it was enqueued (or at its ``due_at``, if
sooner): in the order they were enqueued. A ripe record that is due goes to dispatch; one
not due yet hops to the delay topic its remaining wait belongs in, enqueued when it
ripened: the end of its own tier while that wait is a period or more (a 5.7-h wait in
``retry.1h.v1`` takes five hops), a shorter tier, then ``quarantine.v1``, after. Back to
its own tier every time, a record waited behind the records enqueued up to a period after
it (a 6.5-h retry left ``retry.6h.v1`` after 12 h). The hop is decided from the record's
own times (when the relay keeps up), which a strict endpoint's head and the followers
parked behind it share, so they hop together and stay in their order (one key: one
partition). ``quarantine.v1``
records ripen at their ``due_at``, which the agent puts at most a minute after it enqueued
them; one due later than that (another producer, a clock ahead) ripens two minutes after
it was enqueued and goes to the delay topic its remaining wait belongs in. A record's
``enqueued_at`` counts as the relay's clock when it is missing or ahead of it.

The consumer keeps polling (so it stays in its group) with a poll timeout no longer than
the wait for the earliest paused head: records are never released early, and late by about
one poll (a quarantine record behind a later-due one waits for it: at most a minute, as
the agent puts a divert due later in a retry tier; core/quarantine.py). Republishing and
the input offsets go in one Kafka transaction. A ``due_at`` further ahead than any
configuration schedules (:data:`~postbacks.core.delay.MAX_AHEAD_MS`) would stop its
partition until then: that delivery is dead-lettered (``invalid_record``) instead, with a
``dead_lettered`` outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from confluent_kafka import Consumer, Message, TopicPartition

from postbacks.codec import Codec, codec_for
from postbacks.core.delay import due_too_far, is_due, ripe_at, wait_s
from postbacks.core.outcomes import make_outcome
from postbacks.core.quarantine import QUARANTINE_PERIOD_MS, divert_topic
from postbacks.errors import DeadLetterError, InvalidRecord
from postbacks.kafka.clients import (
    check_broker,
    consume_ready,
    make_consumer,
    records,
)
from postbacks.kafka.stage import Output, commit_batch, dead_letter_for, message_max
from postbacks.kafka.txn import TxnProducer
from postbacks.kafka.watchdog import subscribe_watched
from postbacks.metrics import LATENCY, RELAY_PAUSED, STAGE_RECORDS
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from topics import RETRY_TIERS, TOPICS

__all__ = ["run_relay"]

log = logging.getLogger(__name__)

_HOP_SLACK_MS = 60_000  # a hop counts from when the record ripened if read this soon after
GROUP = "postbacks-relay"
_OUTCOME = codec_for("Outcome")


def run_relay(
    settings: Settings, stop: threading.Event, *, clock: Callable[[], float] = time.time
) -> None:
    check_broker(settings)
    codec = codec_for("Delivery")
    dlq = codec_for("DeadLetter")
    # Per paused partition: the records already fetched behind a head that is not due,
    # kept in order (never re-fetched), released as they fall due.
    held: dict[tuple[str, int],
               deque[tuple[Message, DeliveryRecord | DeadLetterError, int | None]]] = {}
    # a retry tier's period by topic: its records ripen this long after being enqueued
    period_ms = {settings.topic(TOPICS.retry_tier(name).base): seconds * 1000
                 for name, seconds in RETRY_TIERS}
    period_ms[settings.topic(TOPICS.quarantine.base)] = QUARANTINE_PERIOD_MS

    def on_revoke(_c: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            held.pop((tp.topic, tp.partition), None)
        RELAY_PAUSED.set(len(held))

    consumer = make_consumer(settings, GROUP)
    producer = TxnProducer.create(settings, "relay")
    limit = message_max(settings, "relay")
    inputs = [settings.topic(t.base) for t in (*TOPICS.retry, TOPICS.quarantine)]
    subscribe_watched(consumer, inputs, settings, GROUP, stop, on_revoke=on_revoke)
    processed = STAGE_RECORDS.labels(stage="relay")
    try:
        while not stop.is_set():
            heads = [q[0][2] or 0 for q in held.values() if q]
            msgs = consume_ready(consumer, settings.batch_size,
                                 wait_s(heads, int(clock() * 1000)))
            batch = _Batch(int(clock() * 1000), codec, dlq, limit)
            now_ms = batch.now_ms
            release = batch.release
            for key, queue in list(held.items()):
                while queue and is_due(queue[0][2], now_ms):
                    release(*queue.popleft())
                if not queue:
                    del held[key]
                    consumer.resume([TopicPartition(*key)])
            for m in records(msgs, "relay"):
                key = (m.topic() or "", m.partition() or 0)
                d: DeliveryRecord | DeadLetterError
                try:
                    rec: DeliveryRecord = codec.decode(m.value())  # type: ignore[assignment]
                    why = due_too_far(rec["due_at"], now_ms)
                    if why is not None:
                        raise InvalidRecord(f"delivery {rec['delivery_id']!r}: {why}")
                    d = rec
                except DeadLetterError as exc:
                    d = exc  # dead-lettered in its turn, so offsets stay in order
                ripe = _ripe(d, period_ms.get(key[0]), now_ms)
                if key in held:
                    held[key].append((m, d, ripe))
                elif is_due(ripe, now_ms):
                    release(m, d, ripe)
                else:
                    consumer.pause([TopicPartition(*key)])
                    held[key] = deque([(m, d, ripe)])
            RELAY_PAUSED.set(len(held))
            if batch.offsets:
                if not commit_batch("relay", settings, consumer, producer, batch.out,
                                    batch.offsets):
                    held.clear()  # rewound to committed offsets: everything is re-read
                    RELAY_PAUSED.set(0)
                    consumer.resume(consumer.assignment())
                else:  # the records released, once committed (not the partitions)
                    processed.inc(batch.released)
    finally:
        consumer.close()


class _Batch:
    """What one loop turn republishes (or dead-letters) and the offsets it commits."""

    def __init__(self, now_ms: int, codec: Codec, dlq: Codec, limit: int) -> None:
        self.now_ms = now_ms
        self.limit = limit  # what one message of the relay's producer may hold
        self.out = Output()
        self.offsets: dict[tuple[str, int], int] = {}
        self.released = 0
        self._codec = codec
        self._dlq = dlq

    def release(self, m: Message, d: DeliveryRecord | DeadLetterError,
                ripe: int | None = None) -> None:
        self.offsets[(m.topic() or "", m.partition() or 0)] = (m.offset() or 0) + 1
        self.released += 1
        if isinstance(d, DeadLetterError):
            dl = dead_letter_for(m, "relay", d, d.reason, self.now_ms, limit=self.limit)
            self.out.add_dead_letter(dl["original_key"], self._dlq.encode(dl), d.reason)
            self._ended(m, d)
            return
        due = d["due_at"]
        if due is not None and due > self.now_ms:
            # ripe, not due: on to the delay topic its remaining wait belongs in, counted
            # from when it ripened -- its own tier while that wait is a period or more, a
            # shorter one after. (Back to the end of its own tier, it waited behind records
            # enqueued up to a period after it: a 6.5-h retry left retry.6h.v1 after 12 h.)
            # From the record's own times when read within a minute of ripening, as the
            # relay keeps up: a head and the followers parked behind it share them, so they
            # go to the same topic, in their order (behind that, a follower hopping apart
            # comes back early, and the agent parks it behind its head again).
            # (the relay's clock instead when it read the record long after it ripened:
            # a wait counted from an enqueue time far back would pick a tier too long
            # for what is left, and one that ripened at once again, hop after hop)
            at = (ripe if ripe is not None and 0 <= self.now_ms - ripe <= _HOP_SLACK_MS
                  else self.now_ms)
            d["enqueued_at"] = at
            self.out.add(divert_topic(due, at), d["endpoint_id"].encode(),
                         self._codec.encode(d))
            return
        d["enqueued_at"] = self.now_ms
        if due is not None:
            LATENCY.labels(phase="relay_lateness").observe((self.now_ms - due) / 1000)
        self.out.add(TOPICS.dispatch.base, d["endpoint_id"].encode(), self._codec.encode(d))

    def _ended(self, m: Message, exc: DeadLetterError) -> None:
        """A decodable delivery dead-lettered here (a ``due_at`` too far ahead) ends on
        outcomes.v1 too: its status stayed quarantined or failing for good."""
        try:  # the frame only: one refused for a field (its attempt) still ends here
            d: DeliveryRecord = self._codec.decode_frame(m.value())  # type: ignore[assignment]
            o = _OUTCOME.encode(make_outcome(d, "dead_lettered", now_ms=self.now_ms,
                                             reason=exc.reason))
        except (DeadLetterError, ValueError):
            return  # no delivery to speak of, or none an outcome can hold: its dead letter
        self.out.add(TOPICS.outcomes.base, d["endpoint_id"].encode(), o)


def _ripe(d: DeliveryRecord | DeadLetterError, period_ms: int | None,
          now_ms: int) -> int | None:
    return None if isinstance(d, DeadLetterError) else ripe_at(d["due_at"], d["enqueued_at"],
                                                                period_ms, now_ms)
