"""PostgreSQL sink: deliveries, attempts, outcomes and dead letters -> tables, exactly once.

Reads ``read_committed`` and stores its consumer offsets in ``sink_offsets`` **in the same
PostgreSQL transaction** as the rows they cover; on (re)assignment it seeks to the offsets
stored there, so a crash at any point neither loses nor doubles a row (inserts are also
idempotent on primary keys). Bulk path: COPY straight into each table in a savepoint;
if a row is already stored, COPY into a temp staging table, then ``INSERT ... ON CONFLICT
DO NOTHING`` (:meth:`~sinks.tables.Table.write`). While PostgreSQL is down
the sink rewinds, waits and retries; Kafka holds the backlog. A record the sink cannot
decode is stored as a dead-letter row (stage ``sink``) with its original bytes.

A record that decodes but that PostgreSQL refuses (a NUL character in a text or jsonb
value, a text too long for its column's index: records from another producer than the
stages, which check their own) fails its whole batch. The sink then rewinds, and re-reads
that batch checking every row (:mod:`sinks.refusals`): a row with such a value becomes a
dead-letter row (reason ``invalid_record``, the column named) and the rest are written.
Rows are checked only then, so the check costs nothing in steady traffic. A refusal the
check does not know fails the checked batch again; the sink then writes it row by row
(:mod:`sinks.careful`).

Delivery rows wait for their first outcome (and a ``delivered`` one for the attempt it
reports) before they are written, already projected (:mod:`sinks.waiting`); the
offsets stored never pass a waiting row. The projection statement re-derives the rows
touched by a record not folded into a waiting row and the rows released not final; a row
released final (delivered, by the highest attempt folded in; produced after the sink was
given its partition, nothing of its delivery read before it) is skipped unless the batch's
insert met a stored row. The statement was about a third of PostgreSQL's CPU per delivery.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from postbacks.codec import codec_for
from postbacks.core.endpoint_health import fold_attempts
from postbacks.db.connect import connect
from postbacks.db.endpoint_health import record_batch
from postbacks.db.migrate import DayPartitions
from postbacks.errors import DeadLetterError, InvalidRecord
from postbacks.kafka.leaders import until_leader_known
from postbacks.metrics import DLQ_TOTAL, SINK_ROWS
from postbacks.settings import Settings
from sinks import projection
from sinks.careful import REFUSALS, Origin, undecodable_letter, write_carefully
from sinks.intents import IntentBook
from sinks.refusals import feed_problem, indexed_columns, intent_problem, row_problems
from sinks.tables import STAGING_DDL, TABLES, column_types, unprojected, use_orjson
from sinks.waiting import Partition, WaitingRows
from topics import TOPICS

__all__ = ["GROUP", "REFUSALS", "PostgresSink"]

log = logging.getLogger(__name__)

GROUP = "postbacks-sink"

class PostgresSink:
    """``add()`` decoded rows, ``flush()`` them with the offsets in one transaction."""

    def __init__(self, settings: Settings, *, defer_s: float | None = None,
                 defer_max: int | None = None) -> None:
        self.settings = settings
        self.group = settings.topic(GROUP)
        self._conn: psycopg.Connection[Any] | None = None
        self._days = DayPartitions()
        self._types: dict[str, list[int]] = {}  # per table, read when connecting
        self._rows: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
        self._touched: set[str] = set()  # ids the projection statement re-derives
        self._settled: set[str] = set()  # rows released final: re-derived only on a conflict
        self._via_staging: set[str] = set()  # tables whose last batch met a stored row
        self._suppressed: list[str] = []  # this batch's ``suppressed`` outcome ids
        self._offsets: dict[Partition, int] = {}  # next offsets to store at the next flush
        self._waiting = WaitingRows(
            settings.sink_defer_s if defer_s is None else defer_s,
            settings.sink_defer_max if defer_max is None else defer_max)
        self._intents = IntentBook(settings.attempt_lost_after_s)  # sinks/intents.py
        # Partitions whose rows are checked before they are noted, up to an offset: those
        # of a batch PostgreSQL refused for a value in it (:meth:`refused`).
        self._checked: dict[Partition, int] = {}
        # Partitions whose rows are written one by one, up to an offset: those of a checked
        # batch PostgreSQL refused again (:meth:`careful`); where their rows were read.
        self._careful: dict[Partition, int] = {}
        self._origins: dict[tuple[str, Any], Origin] = {}
        self._msg: Message | None = None  # the record add() is taking
        self._indexed: dict[str, frozenset[str]] = {}  # per table, read when connecting
        # The sink's own dead letters per reason, counted in ``webhook_dlq_total`` once the
        # flush holding them commits: a batch read again after a rewind counts once.
        self._dead: Counter[str] = Counter()
        self._deliveries = settings.topic(TOPICS.deliveries.base)
        self._by_topic = {
            settings.topic(TOPICS.deliveries.base): ("Delivery", TABLES["deliveries"]),
            settings.topic(TOPICS.attempts.base): ("Attempt", TABLES["attempts"]),
            settings.topic(TOPICS.outcomes.base): ("Outcome", TABLES["outcomes"]),
            settings.topic(TOPICS.dlq.base): ("DeadLetter", TABLES["dead_letters"]),
        }

    @property
    def topics(self) -> list[str]:
        return list(self._by_topic)

    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            # keepalives: a server gone without a word fails the flush in ~30 s, not ~15 min
            self._conn = connect(self.settings.database_url, kept=True)
            # Each flush's statements are small keyed lookups and writes: compiling one
            # (JIT, when its estimated cost passes jit_above_cost) took ~40 ms of a flush.
            self._conn.execute("SET jit = off")
            self._conn.execute(STAGING_DDL)
            use_orjson(self._conn)
            self._types = column_types(self._conn)
            self._indexed = indexed_columns(self._conn)
            self._conn.commit()
            self._days.keep(self._conn)  # the coming week's partitions, and daily after
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def stored_offsets(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        rows = self.conn().execute(
            "SELECT topic, kafka_partition, next_offset FROM sink_offsets"
            " WHERE consumer_group = %s",
            (self.group,),
        ).fetchall()
        self.conn().commit()
        stored = {(t, p): o for t, p, o in rows}
        return [
            TopicPartition(tp.topic, tp.partition, stored.get((tp.topic, tp.partition),
                                                              OFFSET_BEGINNING))
            for tp in partitions
        ]

    def add(self, msg: Message, now_ms: int) -> None:
        topic = msg.topic() or ""
        record, _table = self._by_topic[topic]
        try:
            value = codec_for(record).decode(msg.value())
            self._msg = msg
            self.add_record(topic, msg.partition() or 0, msg.offset() or 0, value)
        except DeadLetterError as exc:
            tp, offset = (topic, msg.partition() or 0), msg.offset() or 0
            self._offsets[tp] = offset + 1
            if topic == self._deliveries:
                self._waiting.passed(tp, offset)
            self._rows["dead_letters"].append(undecodable_letter(msg, exc, now_ms))
            self._dead[exc.reason] += 1
        finally:
            self._msg = None

    def add_record(self, topic: str, partition: int, offset: int, value: Any) -> None:
        """One decoded record read from ``topic``; its offset is stored with the rows at the
        next flush. Raises :class:`InvalidRecord`, before anything is noted, for a value its
        table cannot hold (a timestamp past the year 9999): dead-lettered, not a sink that
        fails on it again after every restart."""
        _record, table = self._by_topic[topic]
        try:
            row = table.row(value)
        except (ValueError, OverflowError, OSError) as exc:
            raise InvalidRecord(f"{table.name}: a value the table cannot hold: {exc}") from exc
        fed = feed_problem(table.name, row) or intent_problem(table.name, value)
        if fed is not None:
            raise InvalidRecord(f"{table.name}: {fed}")
        if self._checked and offset < self._checked.get((topic, partition), -1):
            problems = row_problems(table.columns, row, self._indexed.get(table.name,
                                                                          frozenset()))
            if problems:
                raise InvalidRecord(f"{table.name}: a value PostgreSQL refuses: "
                                    + "; ".join(problems))
        if self._careful and offset < self._careful.get((topic, partition), -1):
            self._origins[(table.name, row[0])] = (
                Origin(topic, partition, offset, None, None) if self._msg is None
                else Origin.of(self._msg))
        self._offsets[(topic, partition)] = offset + 1
        if table.name == "attempts" and self._intents.add(value):
            return  # an intent: kept apart until its attempt's record comes
        folded = False  # into a waiting row, whose release decides its projection
        if topic == self._deliveries:
            if not self._waiting.read(row, (topic, partition), offset):
                return
        elif table.name == "outcomes":
            folded = self._waiting.outcome(value["delivery_id"], row)
        elif table.name == "attempts":
            folded = self._waiting.attempt(value["delivery_id"], row)
        self._rows[table.name].append(row)
        if table.touches_delivery:
            if not folded:
                self._touched.add(value["delivery_id"])
            if value.get("kind") == "suppressed" and "outcome_id" in value:
                self._suppressed.append(value["outcome_id"])

    def refused(self) -> bool:
        """PostgreSQL refused the batch just flushed for a value in it: its partitions'
        rows are checked when read again, up to where the batch ended. False when every
        one of them was checked already (the refusal is not one the check knows)."""
        return self._mark(self._checked)

    def careful(self) -> bool:
        """PostgreSQL refused again a batch whose rows were all checked: its partitions'
        rows are written one by one when read again, up to where the batch ended. False
        when every one of them was so already (the refusal is not a row's)."""
        return self._mark(self._careful)

    def _mark(self, marks: dict[Partition, int]) -> bool:
        new = False
        for tp, end in self._offsets.items():
            if end > marks.get(tp, -1):
                marks[tp] = end
                new = True
        return new

    def _write(self, conn: psycopg.Connection[Any], name: str, rows: list[tuple[Any, ...]],
               careful: bool, now_ms: int
               ) -> tuple[int, bool, list[tuple[Any, ...]], set[Any]]:
        """Rows inserted, whether a stored row was met, and (written one by one) a
        dead-letter row for each row PostgreSQL refused, and the refused rows' ids."""
        if careful:
            topic = next(t for t, (_r, tb) in self._by_topic.items() if tb.name == name)
            return write_carefully(conn, TABLES[name], rows, self._types[name],
                                   self._origins, topic, now_ms)
        n, met = TABLES[name].write(conn, rows, types=self._types[name],
                                    direct=name not in self._via_staging)
        return n, met, [], set()

    def new_rows_from(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Just given (or rewound to) ``partitions`` (the whole assignment): delivery rows
        produced from now on may be written final (:class:`~sinks.waiting.
        WaitingRows`) -- in a partition whose attempts and outcomes partitions this sink
        was given too, and whose end can be read now (the last stable offset: this
        consumer reads committed records, and so does every stage that derives records
        from a row). Others get no final rows until the next assignment."""
        self._waiting.ends_wanted = False
        given = {(tp.topic, tp.partition) for tp in partitions}
        for tp in partitions:
            if tp.topic != self._deliveries:
                continue
            if not all((self.settings.topic(t.base), tp.partition) in given
                       for t in (TOPICS.attempts, TOPICS.outcomes)):
                continue
            part = TopicPartition(tp.topic, tp.partition)
            try:  # a partition just created may have no leader yet
                got = until_leader_known(
                    consumer, [tp.topic],
                    functools.partial(consumer.get_watermark_offsets, part, timeout=5,
                                      cached=False),
                    deadline_s=2.5)
            except KafkaException as exc:
                log.warning("sink: end of %s [%d] unknown (%s); its rows are all "
                            "projected", tp.topic, tp.partition, exc)
                continue
            if got is not None:
                self._waiting.final_from((tp.topic, tp.partition), got[1])

    def ends_wanted(self) -> bool:
        """Whether the partitions' ends must be read again (ids were forgotten)."""
        return self._waiting.ends_wanted

    def waiting(self) -> int:
        """Delivery rows waiting for their first outcome (or the attempt it reports)."""
        return len(self._waiting)

    def pending(self) -> bool:
        """Whether a flush has anything to write."""
        return bool(self._offsets) or self._waiting.due() or self._intents.sweep_due()

    def _release(self, everything: bool) -> None:
        """The waiting rows due now into this flush; their partitions' offsets move on.
        While rows are written one by one, a released row goes in unprojected and is
        projected from the rows stored: an outcome folded into it may be refused."""
        rows = self._rows["deliveries"]
        careful = bool(self._careful)
        for row, partitions, final in self._waiting.release(everything):
            if careful:
                row, final = unprojected(row), False
            rows.append(row)
            (self._settled if final else self._touched).add(row[0])
            for tp in partitions:
                self._offsets[tp] = self._waiting.next_offset(tp)

    def flush(self, everything: bool = False) -> dict[str, int]:
        """Write the added rows, the delivery rows due (``everything``: all waiting) and
        the offsets in one transaction; returns rows per table."""
        written: dict[str, int] = {}
        self._release(everything)
        conn = self.conn()
        try:
            with conn.transaction():
                self._intents.answer(conn)
                careful, now_ms = bool(self._careful), int(time.time() * 1000)
                letters: list[tuple[Any, ...]] = []  # for the rows refused, written carefully
                refused_attempts: set[Any] = set()
                for name in ("deliveries", "attempts", "outcomes", "dead_letters"):
                    rows = self._rows.get(name, [])
                    if name == "dead_letters":
                        rows = rows + letters
                    if rows:
                        written[name], met, more, ids = self._write(conn, name, rows, careful,
                                                                    now_ms)
                        if name == "attempts":
                            refused_attempts = ids
                        if name == "dead_letters" and more:  # a letter refused: its own
                            self._dead["invalid_record"] += len(ids - {x[0] for x in letters})
                            written[name] += self._write(conn, name, more, False, now_ms)[0]
                        else:
                            self._dead["invalid_record"] += len(more)
                            letters.extend(more)
                        if met:
                            self._via_staging.add(name)
                        else:
                            self._via_staging.discard(name)
                self._intents.settle(conn)
                if written.get("deliveries", 0) < len(self._rows.get("deliveries", ())):
                    # a row already stored (read again, or a conversion fanned out again)
                    # was not replaced by the one projected here: re-derive them all
                    self._touched |= self._settled
                if self._touched or self._suppressed:
                    projection.project_status(conn, sorted(self._touched),
                                              self._suppressed)
                attempts = [a for a in self._rows.get("attempts", ())
                            if a[0] not in refused_attempts]
                if attempts:  # each endpoint's health, for auto-disable and the console
                    record_batch(conn, fold_attempts(
                        (a[3], int(a[1].timestamp() * 1000), a[7], a[8]) for a in attempts))
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO sink_offsets (consumer_group, topic, kafka_partition,"
                        " next_offset) VALUES (%s, %s, %s, %s) ON CONFLICT (consumer_group,"
                        " topic, kafka_partition) DO UPDATE SET next_offset ="
                        " EXCLUDED.next_offset, updated_at = now()",
                        [(self.group, t, p, self._waiting.stored((t, p), o))
                         for (t, p), o in self._offsets.items()],
                    )
        except BaseException:
            self._dead.clear()
            raise
        finally:
            self._intents.clear()
            self._rows.clear()
            self._touched.clear()
            self._settled.clear()
            self._suppressed.clear()
        for tp, o in self._offsets.items():
            stored = self._waiting.stored(tp, o)
            if self._checked.get(tp, stored + 1) <= stored:  # stored past the refused batch
                del self._checked[tp]
            if self._careful.get(tp, stored + 1) <= stored:
                del self._careful[tp]
        if not self._careful:  # kept while any is, for the rows still waiting
            self._origins.clear()
        self._offsets.clear()
        for name, n in written.items():
            SINK_ROWS.labels(table=name).inc(n)
        for reason, n in self._dead.items():
            DLQ_TOTAL.labels(stage="sink", reason=reason).inc(n)
        self._dead.clear()
        self._days.keep(conn)  # once a UTC day: a sink stays connected for weeks
        return written

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Partitions revoked: their waiting rows go (the new owner reads them again from
        the offsets stored, which stop at them). Called from ``consume``'s rebalance
        callback; records of a revoked partition fetched before it are purged by
        librdkafka (>= 1.6), so none of them reaches ``add`` after this."""
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._offsets.pop(key, None)  # never past rows not written
            self._waiting.forget(key)
            self._checked.pop(key, None)  # the new owner finds its own refusals
            self._careful.pop(key, None)

    def discard(self) -> None:
        """Drop everything not written (a failed flush): the consumer rewinds to the stored
        offsets, which stop at the first waiting row of each partition."""
        self._rows.clear()
        self._touched.clear()
        self._settled.clear()
        self._suppressed.clear()
        self._intents.clear()
        self._origins.clear()
        self._offsets.clear()
        self._dead.clear()
        self._waiting.clear()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
