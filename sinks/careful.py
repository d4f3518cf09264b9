"""Writing a batch row by row, when PostgreSQL refused it for a reason the sink's check does
not know (a constraint or trigger an operator added, a value no check foresaw).

The batch is written in its usual transaction and order (deliveries, attempts, outcomes,
dead letters), each row in a savepoint of its own, so a row is judged with every row before
it in place, as in the bulk write. A row PostgreSQL refuses is left out and becomes a
dead-letter row (reason ``invalid_record``, PostgreSQL's message, the record it came from
where the sink still knows it); the rest are written. Meanwhile a delivery row released
from waiting goes in unprojected and is projected from the rows stored (an outcome folded
into it may be refused), and a refused attempt counts nowhere in endpoint health. A
refusal only at COMMIT (a deferred constraint) or by a statement after the rows (the
status projection, endpoint health) is not a row's, and the batch still fails. A refused
attempt record is in the dead letters, not in the attempt log (its intent was answered).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from postbacks.errors import DeadLetterError
from postbacks.ids import new_id
from sinks.tables import Table, ts_from_ms

__all__ = ["REFUSALS", "Origin", "refusal_text", "undecodable_letter", "write_carefully"]

# What PostgreSQL says of a value or a row it will not store (rather than of itself or the
# connection): a batch refused so is read again checked, then written row by row. A
# trigger's ``RAISE EXCEPTION`` (SQLSTATE P0001) is such a refusal.
REFUSALS: tuple[type[psycopg.Error], ...] = (
    psycopg.DataError, psycopg.IntegrityError, psycopg.errors.ProgramLimitExceeded,
    psycopg.errors.RaiseException, psycopg.errors.AssertFailure)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a row's record was read."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    ts_ms: int | None = None  # the record's timestamp

    @classmethod
    def of(cls, msg: Message) -> Origin:
        kind, ts = msg.timestamp()
        return cls(msg.topic() or "", msg.partition() or 0, msg.offset() or 0, msg.key(),
                   msg.value(), ts if kind != TIMESTAMP_NOT_AVAILABLE else None)


def refusal_text(table: str, exc: BaseException) -> str:
    first = str(exc).strip().splitlines()
    return (f"{table}: PostgreSQL refuses the row: {type(exc).__name__}: "
            f"{first[0] if first else ''}")[:2000]


def _letter(table: Table, row: tuple[Any, ...], exc: BaseException, origin: Origin | None,
            topic: str, now_ms: int) -> tuple[Any, ...]:
    # Without its record (a delivery row that waited past the flush that read it): the
    # row's own first timestamp keeps the id stable on a re-read.
    o = origin or Origin(topic, -1, -1, None, None, next(
        (int(v.timestamp() * 1000) for v in row if isinstance(v, dt.datetime)), None))
    # The id comes from the record (where it was read, its bytes and timestamp): read
    # again, its letter meets the first copy and is skipped.
    where = f"{o.topic}\x00{o.partition}\x00{o.offset}\x00{table.name}\x00{row[0]}".encode()
    rand = hashlib.blake2b(where + (o.value or b""), digest_size=8).digest()
    cols = table.columns
    delivery = row[cols.index("delivery_id")] if "delivery_id" in cols else None
    endpoint = row[cols.index("endpoint_id")] if "endpoint_id" in cols else None
    return (new_id("dlq", now_ms if o.ts_ms is None else o.ts_ms, rand), "invalid_record",
            type(exc).__name__,
            refusal_text(table.name, exc), "sink", o.topic, o.partition, o.offset, o.key,
            o.value, delivery, endpoint, ts_from_ms(now_ms))


def undecodable_letter(msg: Message, exc: DeadLetterError, now_ms: int) -> tuple[Any, ...]:
    """The dead-letter row of a record the sink could not decode or store. Its id comes
    from the record (where it was read, its bytes and timestamp): read again (behind a
    waiting delivery row, the stored offset stays before it), it meets its first copy."""
    o = Origin.of(msg)
    where = f"{o.topic}\x00{o.partition}\x00{o.offset}\x00".encode()
    rand = hashlib.blake2b(where + (o.value or b""), digest_size=8).digest()
    return (new_id("dlq", now_ms if o.ts_ms is None else o.ts_ms, rand), exc.reason,
            type(exc).__name__, str(exc), "sink", o.topic, o.partition, o.offset, o.key,
            o.value, None, None, ts_from_ms(now_ms))


def write_carefully(conn: psycopg.Connection[Any], table: Table, rows: list[tuple[Any, ...]],
                    types: Sequence[int], origins: dict[tuple[str, Any], Origin],
                    topic: str, now_ms: int
                    ) -> tuple[int, bool, list[tuple[Any, ...]], set[Any]]:
    """Write ``rows`` one by one, each in a savepoint (inside the caller's transaction);
    returns the rows inserted, True (as if a stored row was met: the table's next batch
    goes through staging), a dead-letter row for each refused one, and the refused rows'
    ids (their first column)."""
    written = 0
    letters: list[tuple[Any, ...]] = []
    refused: set[Any] = set()
    for row in rows:
        try:
            with conn.transaction():
                n, _met = table.write(conn, [row], types=types, direct=False)
            written += n
        except REFUSALS as exc:
            letters.append(_letter(table, row, exc, origins.get((table.name, row[0])), topic,
                                   now_ms))
            refused.add(row[0])
    return written, True, letters, refused
