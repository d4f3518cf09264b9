"""The one shape of every consume-transform-produce stage.

consume a batch (what arrives within ``POSTBACKS_BATCH_WITHIN_MS`` of its first record:
``consume_gathered``) -> decode -> core -> encode -> produce -> send offsets -> commit, with the
outputs of the batch and its input offsets in **one Kafka transaction**. A record that can
never be processed becomes a DeadLetter (original bytes kept) inside the same transaction,
so a bad record neither crashes the process nor stalls its partition. A dead letter that
would not fit one message of the stage's producer keeps only the first bytes of the
original value and key, and says so (:func:`dead_letter_for`). On an abortable
transaction error the batch is aborted and the consumer rewound to its committed offsets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_dead_letter
from postbacks.errors import DeadLetterError
from postbacks.kafka.clients import consume_gathered, records, transactional_config
from postbacks.kafka.txn import TxnProducer, retrying
from postbacks.kafka.watchdog import guard, subscribe_watched
from postbacks.metrics import DLQ_TOTAL, STAGE_RECORDS, TXN_ABORTS, TXN_SECONDS
from postbacks.records import DeadLetterRecord
from postbacks.settings import Settings
from topics import TOPICS

__all__ = ["DELIVERY_HEADROOM", "MESSAGE_MAX", "Emit", "Output", "commit_batch", "dead_letter_for",
           "fit_dead_letter", "message_max", "run_stage"]

log = logging.getLogger(__name__)

MESSAGE_MAX = 1_000_000  # librdkafka's message.max.bytes when the config does not set it
# The output bytes one transaction gathers before it commits, mid-batch if need be: a batch
# of records just under the size limit, fanned out to several endpoints each, held
# hundreds of MiB until its commit, and a stage killed for its memory read the same batch
# again after every restart.
DELIVERY_HEADROOM = 65_536  # what later stages add to a delivery (hold reason, errors, override)
OUTPUT_BUDGET = 32 * 1024 * 1024
_DLQ_SLACK = 512  # per-message and length-prefix overhead around a dead letter's bytes
_KEY_KEPT = 1024  # the first bytes of the original key a cut dead letter keeps


@dataclass(slots=True)
class Output:
    """Messages a handler wants produced, in order: (topic base name, key, value); and the
    dead letters among them by reason, counted in ``webhook_dlq_total`` only once the
    transaction that produces them commits (an aborted batch is read and counted again)."""

    items: list[tuple[str, bytes | None, bytes]] = field(default_factory=list)
    dead: Counter[str] = field(default_factory=Counter)
    size: int = 0  # the bytes of every key and value

    def add(self, topic_base: str, key: bytes | None, value: bytes) -> None:
        self.items.append((topic_base, key, value))
        self.size += len(value) + (len(key) if key else 0)

    def add_dead_letter(self, key: bytes | None, value: bytes, reason: str) -> None:
        self.items.append((TOPICS.dlq.base, key, value))
        self.size += len(value) + (len(key) if key else 0)
        self.dead[reason] += 1


Emit = Callable[[Message, Output, int], None]


def message_max(settings: Settings, stage: str) -> int:
    """What one message of ``stage``'s transactional producer may hold (librdkafka refuses
    more with MSG_SIZE_TOO_LARGE, which aborts the whole transaction)."""
    return int(transactional_config(settings, stage).get("message.max.bytes", MESSAGE_MAX))


def dead_letter_for(
    msg: Message, stage: str, exc: BaseException, reason: str, now_ms: int,
    *, delivery_id: str | None = None, endpoint_id: str | None = None,
    limit: int = MESSAGE_MAX,
) -> DeadLetterRecord:
    """The dead letter of ``msg``, original bytes kept. If it would not fit a message of
    ``limit`` bytes with its original key as the message's key, ``original_key`` keeps
    the key's first kilobyte and ``original_value`` as much of the value as fits, and
    ``error_message`` begins by saying so. Produce it keyed by its ``original_key``."""
    return fit_dead_letter(make_dead_letter(
        topic=msg.topic() or "", partition=msg.partition() or 0, offset=msg.offset() or 0,
        key=msg.key(), value=msg.value(), stage=stage, exc=exc, reason=reason, now_ms=now_ms,
        delivery_id=delivery_id, endpoint_id=endpoint_id,
    ), limit)


def fit_dead_letter(dl: DeadLetterRecord, limit: int = MESSAGE_MAX) -> DeadLetterRecord:
    """``dl`` as :func:`dead_letter_for` leaves it: cut to fit a message of ``limit`` bytes
    keyed by its ``original_key`` (for stages that build their own dead letters)."""
    key, value = dl["original_key"], dl["original_value"]
    encode = codec_for("DeadLetter").encode
    if len(key or b"") + len(encode(dl)) + _DLQ_SLACK <= limit:
        return dl
    note = (f"original bytes cut to fit a dead letter: value {len(value or b''):,} bytes, "
            f"key {len(key or b''):,} bytes; original_value and original_key hold their "
            "first bytes only. ")
    dl["error_message"] = (note + dl["error_message"])[:2000]
    kept_key = None if key is None else key[:_KEY_KEPT]
    dl["original_key"] = kept_key
    if value is not None:
        dl["original_value"] = b""
        # less the longest length prefix (a zig-zag varint) the value's bytes can take
        room = limit - len(kept_key or b"") - len(encode(dl)) - _DLQ_SLACK - 10
        dl["original_value"] = value[:max(room, 0)]
    return dl


def _rewind(consumer: Consumer, deadline: float) -> None:
    assignment = consumer.assignment()
    if not assignment:
        return
    committed: list[TopicPartition] = []
    retrying("committed offsets",
              lambda: committed.extend(consumer.committed(assignment, timeout=30)), deadline)
    for tp in committed:
        try:
            consumer.seek(TopicPartition(tp.topic, tp.partition,
                                         tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
        except KafkaException as exc:  # no longer ours / not fetching yet: on (re)assignment
            log.info("rewind of %s[%d] skipped: %s", tp.topic, tp.partition, exc)  # it starts
            # from the committed offset anyway


def run_stage(
    stage: str,
    settings: Settings,
    consumer: Consumer,
    producer: TxnProducer,
    input_bases: list[str],
    handle: Emit,
    stop: threading.Event,
    *,
    group: str,
    clock: Callable[[], float] = time.time,
    after_commit: Callable[[bool], None] | None = None,
) -> None:
    """Run until ``stop`` is set. ``handle`` may raise DeadLetterError for one record.
    ``group``: the base name ``consumer`` was made with (``make_consumer``), for the group
    watch. ``after_commit(committed)`` after each transaction (a batch's, or a part of one
    that made :data:`OUTPUT_BUDGET` bytes of output): False when it was aborted and its
    records will be read again (a handler keeping memory of what it saw undoes that
    transaction's part of it)."""
    dlq_codec = codec_for("DeadLetter")
    limit = message_max(settings, stage)
    revoked = [0]

    def count_revoked(_c: Consumer, _p: list[TopicPartition]) -> None:
        revoked[0] += 1

    subscribe_watched(consumer, [settings.topic(b) for b in input_bases], settings, group, stop,
                      on_revoke=count_revoked)
    within = settings.batch_within_ms / 1000
    processed = STAGE_RECORDS.labels(stage=stage)
    def commit(out: Output, offsets: dict[tuple[str, int], int], n: int) -> bool:
        committed = commit_batch(stage, settings, consumer, producer, out, offsets)
        if after_commit is not None:
            after_commit(committed)
        processed.inc(n)
        return committed

    try:
        while not stop.is_set():
            msgs = consume_gathered(consumer, settings.batch_size, 0.5, within,
                                    lambda: revoked[0])
            if not msgs:
                continue
            now_ms = int(clock() * 1000)
            out = Output()
            offsets: dict[tuple[str, int], int] = {}
            taken = 0
            for m in records(msgs, stage):
                if out.size >= OUTPUT_BUDGET:  # commit what the batch has made so far
                    if not commit(out, offsets, taken):
                        break  # aborted and rewound: the rest is read again
                    out, offsets, taken = Output(), {}, 0
                taken += 1
                offsets[(m.topic() or "", m.partition() or 0)] = (m.offset() or 0) + 1
                try:
                    handle(m, out, now_ms)
                except DeadLetterError as exc:
                    dl = dead_letter_for(m, stage, exc, exc.reason, now_ms, limit=limit)
                    out.add_dead_letter(dl["original_key"], dlq_codec.encode(dl), exc.reason)
                    log.warning("%s: dead-lettered %s[%s]@%s: %s", stage, m.topic(),
                                m.partition(), m.offset(), exc)
                except Exception as exc:  # a bug must not stall the partition either
                    log.exception("%s: unexpected error on %s@%s", stage, m.topic(), m.offset())
                    dl = dead_letter_for(m, stage, exc, "internal_error", now_ms, limit=limit)
                    out.add_dead_letter(dl["original_key"], dlq_codec.encode(dl),
                                        "internal_error")
            else:
                if offsets:
                    commit(out, offsets, taken)
    finally:
        consumer.close()


class _Producing(Protocol):
    def produce(self, topic: str, value: bytes | None, key: bytes | None) -> None: ...
    def poll(self, timeout: float) -> int: ...


def produce_or_dead_letter(producer: _Producing, stage: str, topic: str, dlq_topic: str,
                           key: bytes | None, value: bytes | None,
                           dead: Counter[str] | None = None) -> None:
    """Produce one output record (waiting while the local queue is full). A record over
    the producer's message size (a stage's output grown past the limit from an input just
    under it) is dead-lettered instead (``too_large``, its first bytes kept): one record
    the broker would refuse must not fail the batch, and with it the partition, for ever.
    Such a dead letter is counted in ``dead`` (by the caller once it commits), or at once."""
    while True:
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:
            producer.poll(0.05)
        except KafkaException as exc:
            kerr = exc.args[0] if exc.args else None
            if not isinstance(kerr, KafkaError) or kerr.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            log.error("%s: a record for %s of %d bytes is over the message size limit: "
                      "dead-lettered", stage, topic, len(value or b"") + len(key or b""))
            dl = fit_dead_letter(make_dead_letter(
                topic=topic, partition=-1, offset=-1, key=key, value=value, stage=stage,
                exc=ValueError(f"an output record for {topic} of {len(value or b''):,} bytes"
                               " is over the message size limit; not produced"),
                reason="too_large", now_ms=int(time.time() * 1000)))
            if dead is None:
                DLQ_TOTAL.labels(stage=stage, reason="too_large").inc()
            else:
                dead["too_large"] += 1
            value, key, topic = codec_for("DeadLetter").encode(dl), dl["original_key"], dlq_topic


def commit_batch(
    stage: str, settings: Settings, consumer: Consumer, txn: TxnProducer,
    out: Output, offsets: Mapping[tuple[str, int], int | tuple[int, str]],
    *, timeout_s: float = 60.0,
) -> bool:
    """Produce ``out`` and commit ``offsets`` in one transaction. False = aborted and the
    consumer rewound to its committed offsets (the caller must forget in-memory progress).

    Retriable errors (a broker restart) are retried for up to ``timeout_s``; an abortable
    one aborts and rewinds; a fatal one (this producer was fenced by a newer instance)
    propagates and ends the process."""
    with guard(f"{stage}: transaction"):
        return _commit_batch(stage, settings, consumer, txn, out, offsets,
                             time.monotonic() + timeout_s)


def _commit_batch(
    stage: str, settings: Settings, consumer: Consumer, txn: TxnProducer,
    out: Output, offsets: Mapping[tuple[str, int], int | tuple[int, str]], deadline: float,
) -> bool:
    producer = txn.producer
    dead = Counter(out.dead)
    retrying(f"{stage}: begin", producer.begin_transaction, deadline)
    try:
        for topic_base, key, value in out.items:
            produce_or_dead_letter(producer, stage, settings.topic(topic_base),
                                   settings.topic(TOPICS.dlq.base), key, value, dead)
        positions = [TopicPartition(t, p, o) if isinstance(o, int)
                     else TopicPartition(t, p, o[0], metadata=o[1])
                     for (t, p), o in offsets.items()]
        # Not retried: a retriable failure here usually means the group moved on (a broker
        # restart, a session timeout), and the consumer can only rejoin once we poll again.
        # Aborting and re-reading from the committed offsets is always safe. A send that
        # hangs in librdkafka (its coordinator gone: see postbacks.kafka.txn) is abandoned
        # with its producer, which a new one replaces: the same as an abort.
        t0 = time.monotonic()
        if not txn.send_offsets(positions, consumer.consumer_group_metadata()):
            TXN_ABORTS.labels(stage=stage, code="offsets_send_hung").inc()
            _rewind(consumer, deadline)
            return False
        t1 = time.monotonic()
        retrying(f"{stage}: commit", lambda: producer.commit_transaction(60), deadline)
        TXN_SECONDS.labels(stage=stage, step="offsets").observe(t1 - t0)
        TXN_SECONDS.labels(stage=stage, step="commit").observe(time.monotonic() - t1)
        for reason, n in dead.items():
            DLQ_TOTAL.labels(stage=stage, reason=reason).inc(n)
        return True
    except KafkaException as exc:
        kerr = exc.args[0] if exc.args else None
        # _STATE: a produce refused because the transaction has already failed (librdkafka
        # knows it before commit does): abort it like any abortable error, not restart
        if isinstance(kerr, KafkaError) and (kerr.txn_requires_abort() or (
                not kerr.fatal() and (kerr.retriable() or kerr.code() == KafkaError._STATE))):
            log.warning("%s: aborting transaction: %s", stage, kerr)
            if kerr.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE):
                log.error("%s: the broker refused a record batch as too large: a topic's "
                          "max.message.bytes is under the producer's batch size, and this "
                          "batch is refused again each time it is read (`postbacks topics "
                          "verify` names the topic; raise its max.message.bytes)", stage)
            TXN_ABORTS.labels(stage=stage, code=kerr.name()).inc()
            retrying(f"{stage}: abort", lambda: producer.abort_transaction(30), deadline)
            _rewind(consumer, deadline)
            return False
        raise
