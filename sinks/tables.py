"""How each sunk record maps onto its table: row shape and the COPY -> INSERT bulk path.

Rows go in binary COPY: the client sends each value in PostgreSQL's own binary form
(a timestamp as 8 bytes, a jsonb as a version byte and its text), so neither side formats
or parses text. Against text COPY, for one delivery's three rows: the writing client
19.6-21.7 against 38.7-48.1 µs of CPU, PostgreSQL's backend 83.5-100 against
106.5-115.5 µs (``bench/copy_rows.py``: 4 alternating rounds of 20,000 deliveries in
400-row batches). Binary COPY needs each column's type: :func:`column_types` reads them
from the catalog when the sink connects and checks them against ``Table.types``, and
jsonb columns take the decoded value itself, dumped by :func:`use_orjson`'s dumper."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg.types.json import set_json_dumps

from postbacks.db.delivery_keys import KEYS_WRITTEN

__all__ = ["PROJECTED", "STAGING_DDL", "TABLES", "Table", "column_types", "latest_outcome",
           "project_row", "settled", "ts_from_ms", "unprojected", "use_orjson"]


def ts_from_ms(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def use_orjson(conn: psycopg.Connection[Any]) -> None:
    """jsonb values on ``conn`` (a COPY column typed jsonb among them) dumped by orjson."""
    set_json_dumps(orjson.dumps, context=conn)


def _copy(cur: psycopg.Cursor[Any], table: str, cols: str, types: Sequence[int],
          rows: list[tuple[Any, ...]]) -> None:
    with cur.copy(f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(list(types))
        for r in rows:
            copy.write_row(r)


_CREATED = 10  # the column of a delivery row's created_at (its key: delivery_id, created_at)


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    target: str
    columns: tuple[str, ...]
    types: tuple[str, ...]  # each column's type as the sink writes it (binary COPY)
    row: Callable[[Any], tuple[Any, ...]]
    touches_delivery: bool
    keyed: bool = False  # one row per delivery_id, held by delivery_keys (deliveries)

    def __post_init__(self) -> None:
        if len(self.types) != len(self.columns):
            raise ValueError(f"{self.name}: {len(self.columns)} columns, "
                             f"{len(self.types)} types")

    @property
    def staging(self) -> str:
        return f"stg_{self.target}"

    def write(self, conn: psycopg.Connection[Any], rows: list[tuple[Any, ...]], *,
              types: Sequence[int], direct: bool = True) -> tuple[int, bool]:
        """Insert ``rows`` (inside the caller's transaction), skipping any already stored;
        returns the rows inserted, and whether a stored row was met. ``types``: the
        columns' type oids (:func:`column_types`).

        ``direct``: first COPY straight into the table, in a savepoint. A row already there
        (a record read again, a duplicate upstream) fails it, and the savepoint goes; then
        (and at once when not ``direct``) COPY into the session's staging table and
        ``INSERT ... ON CONFLICT DO NOTHING`` from it. The direct COPY skips the staging
        table's write and read, and the speculative insertion ``ON CONFLICT`` makes into
        every unique index: 40-60 against 55-85 µs of PostgreSQL's CPU per delivery for its
        three rows into a fresh database, 75-110 against 95-140 µs into one of 13 GB
        (400-row batches, 4 alternating pairs each). A failed COPY leaves the rows it
        wrote as dead tuples, so after meeting a stored row the sink sends the next batch
        of the table through staging (rows read again come in runs).

        ``deliveries`` (partitioned by day; ``keyed``) keeps one row per delivery by its
        key table (:mod:`postbacks.db.delivery_keys`): the direct path COPYs the keys into
        ``delivery_keys`` before the rows, in the same savepoint (a stored key fails it
        like a stored row); the staging path inserts the new keys and, in the same
        statement, only the rows whose key was new."""
        cols = ", ".join(self.columns)
        if direct:
            try:
                with conn.transaction(), conn.cursor() as cur:
                    if self.keyed:
                        cur.execute(KEYS_WRITTEN)
                        _copy(cur, "delivery_keys", "delivery_id, created_at",
                              (types[0], types[_CREATED]), [(r[0], r[_CREATED]) for r in rows])
                    _copy(cur, self.target, cols, types, rows)
                return len(rows), False
            except (psycopg.errors.UniqueViolation, psycopg.errors.ExclusionViolation):
                pass  # what ON CONFLICT DO NOTHING (no target) would have skipped
        with conn.cursor() as cur:
            _copy(cur, self.staging, cols, types, rows)
            if self.keyed:
                cur.execute(KEYS_WRITTEN)
                cur.execute(
                    "WITH k AS (INSERT INTO delivery_keys (delivery_id, created_at)"
                    " SELECT DISTINCT ON (delivery_id) delivery_id, created_at"
                    f" FROM {self.staging} ORDER BY delivery_id, created_at"
                    " ON CONFLICT DO NOTHING RETURNING delivery_id, created_at)"
                    f" INSERT INTO {self.target} ({cols}) SELECT DISTINCT ON (delivery_id)"
                    f" {cols} FROM {self.staging} JOIN k USING (delivery_id, created_at)"
                    " ON CONFLICT DO NOTHING")
            else:
                cur.execute(
                    f"INSERT INTO {self.target} ({cols}) SELECT {cols} FROM {self.staging}"
                    " ON CONFLICT DO NOTHING"
                )
            n = cur.rowcount
            cur.execute(f"TRUNCATE {self.staging}")
        return n, n < len(rows)


# The status projection's columns of a delivery row, at the end of it, and their values
# before any outcome or attempt: (status, status_at, held_at, hold_reason, attempt_count,
# last_error).
PROJECTED = 11
_UNPROJECTED = ("pending", None, None, None, 0, None)


def unprojected(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A delivery row with its status projection as before any outcome or attempt."""
    return (*row[:PROJECTED], *_UNPROJECTED)


def _delivery_row(d: Any) -> tuple[Any, ...]:
    c = d["conversion"]
    return (
        d["delivery_id"], d["endpoint_id"], c["app_id"], c["conversion_id"], c["event_type"],
        c["goal_id"], c["event_id"], d["idempotency_key"], c["payout_usd_micros"], c,
        ts_from_ms(d["created_at"]), *_UNPROJECTED,
    )


def latest_outcome(outcomes: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The outcome row that decides a delivery's status: the latest ``occurred_at``, then
    the highest ``outcome_id`` (the projection statement's order)."""
    return max(outcomes, key=lambda x: (x[9], x[0]))


def _highest_attempt(attempts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The highest attempt number, then the latest ``attempted_at``."""
    return max(attempts, key=lambda x: (x[5], x[1]))


def project_row(row: tuple[Any, ...], outcomes: list[tuple[Any, ...]],
                attempts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A delivery row with the status projection of these outcome and attempt rows (of the
    same delivery) applied: the rule the sink's SQL projection applies, so a row written
    this way is not rewritten by it. The latest outcome (``occurred_at``, then
    ``outcome_id``) gives the status, and ``held_at``/``hold_reason`` when it is ``held``;
    the highest attempt (``attempt_no``, then ``attempted_at``) the attempt count and last
    error, never lowered. (The SQL looks for attempts only from the delivery's creation
    less an hour to a day past its clock; this counts every attempt it is given, and the
    SQL never lowers a count, so the two differ only for an attempt stamped by a clock
    that far off.)"""
    status, status_at, held_at, hold_reason, count, last_error = row[PROJECTED:]
    if outcomes:
        o = latest_outcome(outcomes)
        status, status_at = o[4], o[9]
        if o[4] == "held":
            held_at, hold_reason = o[9], o[7]
    if attempts:
        a = _highest_attempt(attempts)
        if a[5] >= count:
            count, last_error = a[5], a[9]
    return (*row[:PROJECTED], status, status_at, held_at, hold_reason, count, last_error)


def settled(outcomes: list[tuple[Any, ...]], attempts: list[tuple[Any, ...]]) -> bool:
    """Whether a row projected from these outcome and attempt rows alone is final as far as
    they go: its latest outcome is ``delivered`` and its highest attempt is the one that
    outcome reports. Records of one round of dispatch read elsewhere are older and
    lower-numbered (only a replay comes after a delivery, and it is read after it). A
    delivery dispatched twice numbers its second round afresh, so the sink also requires
    that nothing of the delivery was read, or stored, before the row
    (:class:`~sinks.waiting.WaitingRows`)."""
    if not outcomes or not attempts:
        return False
    o, a = latest_outcome(outcomes), _highest_attempt(attempts)
    return o[4] == "delivered" and o[5] is not None and a[5] == o[5]


def _attempt_row(a: Any) -> tuple[Any, ...]:
    return (
        a["attempt_id"], ts_from_ms(a["attempted_at"]), a["delivery_id"], a["endpoint_id"],
        a["idempotency_key"], a["attempt_no"], a["trigger"], a["result"], a["status_code"],
        a["error_class"], a["error_message"], a["queue_ms"], a["platform_ms"], a["wire_ms"],
        a["request_method"], a["request_url"], a["request_headers"], a["request_body"],
        a["response_excerpt"],
    )


def _outcome_row(o: Any) -> tuple[Any, ...]:
    return (
        o["outcome_id"], o["delivery_id"], o["endpoint_id"], o["app_id"], o["kind"],
        o["attempt_no"], o["payout_usd_micros"], o["reason"], o["actor"],
        ts_from_ms(o["occurred_at"]),
    )


def _dead_letter_row(x: Any) -> tuple[Any, ...]:
    return (
        x["dead_letter_id"], x["reason"], x["error_class"], x["error_message"], x["stage"],
        x["origin_topic"], x["origin_partition"], x["origin_offset"], x["original_key"],
        x["original_value"], x["delivery_id"], x["endpoint_id"], ts_from_ms(x["occurred_at"]),
    )


TABLES: dict[str, Table] = {
    "deliveries": Table(
        "deliveries", "deliveries",
        ("delivery_id", "endpoint_id", "app_id", "conversion_id", "event_type", "goal_id",
         "event_id", "idempotency_key", "payout_usd_micros", "snapshot", "created_at",
         "status", "status_at", "held_at", "hold_reason", "attempt_count", "last_error"),
        ("text", "text", "text", "text", "text", "text", "text", "text", "int8", "jsonb",
         "timestamptz", "text", "timestamptz", "timestamptz", "text", "int4", "text"),
        _delivery_row, True, keyed=True,
    ),
    "attempts": Table(
        "attempts", "delivery_attempts",
        ("attempt_id", "attempted_at", "delivery_id", "endpoint_id", "idempotency_key",
         "attempt_no", "trigger", "result", "status_code", "error_class", "error_message",
         "queue_ms", "platform_ms", "wire_ms", "request_method", "request_url",
         "request_headers", "request_body", "response_excerpt"),
        ("text", "timestamptz", "text", "text", "text", "int4", "text", "text", "int4", "text",
         "text", "float8", "float8", "float8", "text", "text", "jsonb", "bytea", "bytea"),
        _attempt_row, True,
    ),
    "outcomes": Table(
        "outcomes", "delivery_outcomes",
        ("outcome_id", "delivery_id", "endpoint_id", "app_id", "kind", "attempt_no",
         "payout_usd_micros", "reason", "actor", "occurred_at"),
        ("text", "text", "text", "text", "text", "int4", "int8", "text", "text", "timestamptz"),
        _outcome_row, True,
    ),
    "dead_letters": Table(
        "dead_letters", "dead_letters",
        ("dead_letter_id", "reason", "error_class", "error_message", "stage", "origin_topic",
         "origin_partition", "origin_offset", "original_key", "original_value", "delivery_id",
         "endpoint_id", "occurred_at"),
        ("text", "text", "text", "text", "text", "text", "int4", "int8", "bytea", "bytea", "text",
         "text", "timestamptz"),
        _dead_letter_row, False,
    ),
}

def column_types(conn: psycopg.Connection[Any]) -> dict[str, list[int]]:
    """Each table's column type oids, in its COPY column order (what binary COPY sends
    must match them). A column missing from the database, or of another type than the
    sink writes (binary COPY would fail on it, or an int4 take a wrapped value), fails
    here, when the sink connects, before any row."""
    out: dict[str, list[int]] = {}
    for t in TABLES.values():
        found = {name: (oid, typ) for name, oid, typ in conn.execute(
            "SELECT a.attname::text, a.atttypid::int, y.typname::text FROM pg_attribute a"
            " JOIN pg_type y ON y.oid = a.atttypid WHERE a.attrelid = %s::regclass"
            " AND a.attnum > 0 AND NOT a.attisdropped", (t.target,)).fetchall()}
        missing = [c for c in t.columns if c not in found]
        if missing:
            raise RuntimeError(f"table {t.target} has no column(s) {', '.join(missing)}:"
                               " is the database migrated (postbacks migrate)?")
        for column, want in zip(t.columns, t.types, strict=True):
            if found[column][1] != want:
                raise RuntimeError(
                    f"column {t.target}.{column} is {found[column][1]} in the database; the"
                    f" sink writes {want}: is the database migrated to this release"
                    " (postbacks migrate)?")
        out[t.name] = [found[c][0] for c in t.columns]
    return out


# Session-local staging tables, created once per sink connection.
STAGING_DDL = "\n".join(
    f"CREATE TEMP TABLE IF NOT EXISTS stg_{t.target}"
    f" (LIKE {t.target} INCLUDING DEFAULTS);"
    for t in TABLES.values()
)
