"""``delivery_keys``: one row per stored delivery (its id and creation time), the
unpartitioned table that keeps ``deliveries`` (partitioned by day of creation) at one row
per delivery (schema 0010). A delivery's id is derived from its identity (endpoint,
conversion, event type, goal: :func:`postbacks.core.identity.delivery_id`), so the
primary key on the id alone also keeps one row per identity.

The rule every writer follows: in one transaction, insert the keys first
(``ON CONFLICT DO NOTHING``), then only the rows whose key was new, after
:data:`KEYS_WRITTEN`, which tells the table's guard trigger the keys are written. Without
it (SQL by hand) the trigger writes the key itself and refuses a row whose delivery is
stored under another creation time: a row-by-row cost the sink does not pay.

Lookups of a delivery by id read its creation time here first, so PostgreSQL searches the
one day partition that can hold it (:data:`BY_ID`) instead of every day kept. Retention
deletes the keys of a day's partition before dropping it, with its deliveries' outcome rows
and suppressions (:func:`delete_partition_keys`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

__all__ = ["BY_ID", "BY_IDS", "KEYS_WRITTEN", "delete_partition_keys", "insert_keys"]

# SQL conditions on a ``deliveries`` row (no alias) to find it by id in its own day's
# partition: ``%(id)s`` one id, ``%(ids)s`` a text[] of ids.
BY_ID = ("delivery_id = %(id)s AND created_at = (SELECT k.created_at FROM delivery_keys k"
         " WHERE k.delivery_id = %(id)s)")
BY_IDS = ("(delivery_id, created_at) IN (SELECT k.delivery_id, k.created_at"
          " FROM delivery_keys k WHERE k.delivery_id = ANY(%(ids)s))")

# For the rest of the current transaction: this writer writes the keys itself.
KEYS_WRITTEN = "SELECT set_config('postbacks.delivery_keys', 'written', true)"

_BATCH = 10_000


def insert_keys(conn: psycopg.Connection[Any], keys: list[tuple[str, dt.datetime]]
                ) -> set[str]:
    """Insert the keys (delivery id, creation time) not stored yet, inside the caller's
    transaction, and mark it as writing its keys (:data:`KEYS_WRITTEN`); returns the ids
    whose key is new: only their rows are to be inserted."""
    conn.execute(KEYS_WRITTEN)
    if not keys:
        return set()
    rows = conn.execute(
        "INSERT INTO delivery_keys (delivery_id, created_at)"
        " SELECT * FROM unnest(%s::text[], %s::timestamptz[])"
        " ON CONFLICT DO NOTHING RETURNING delivery_id",
        ([k[0] for k in keys], [k[1] for k in keys])).fetchall()
    return {r[0] for r in rows}


def delete_partition_keys(conn: psycopg.Connection[Any], partition: str,
                          batch: int = _BATCH) -> dict[str, int]:
    """Delete the keys of the rows of ``partition`` (a day partition of ``deliveries``
    about to be dropped), with the deliveries' outcome rows and suppressions, ``batch``
    deliveries at a time in delivery id order, each batch its own transaction (``conn`` in
    autocommit); returns how many of each were deleted (``keys``, ``outcomes``,
    ``suppressions``). Done before the drop, so an interrupted run leaves no key without
    its row: the next run deletes the rest, then drops."""
    total = {"keys": 0, "outcomes": 0, "suppressions": 0}
    after = ""
    while True:
        row = conn.execute(
            f'WITH p AS (SELECT delivery_id, created_at FROM "{partition}"'
            "  WHERE delivery_id > %s ORDER BY delivery_id LIMIT %s),"
            " o AS (DELETE FROM delivery_outcomes o USING p WHERE o.delivery_id = p.delivery_id"
            "  RETURNING 1),"
            " s AS (DELETE FROM postback_suppressions s USING p"
            "  WHERE s.delivery_id = p.delivery_id RETURNING 1),"
            " gone AS (DELETE FROM delivery_keys k USING p WHERE k.delivery_id = p.delivery_id"
            "  AND k.created_at = p.created_at RETURNING 1)"
            " SELECT (SELECT max(delivery_id) FROM p), (SELECT count(*) FROM p),"
            " (SELECT count(*) FROM gone), (SELECT count(*) FROM o), (SELECT count(*) FROM s)",
            (after, batch)).fetchone()
        assert row is not None
        total["keys"] += int(row[2])
        total["outcomes"] += int(row[3])
        total["suppressions"] += int(row[4])
        if row[1] < batch:
            return total
        after = row[0]
