"""The sink's status projection on ``deliveries``: one statement re-derives status,
hold, attempt count and last error of the touched deliveries from the stored outcomes and
attempts (:func:`project_status`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

__all__ = ["PROJECT", "project_status"]

_CLOCK_SLACK = dt.timedelta(hours=1)

# One statement re-derives the whole projection of the touched deliveries, each looked up
# by key: the latest outcome of each id through a LIMIT-1 lateral index scan, its highest
# attempt through one scan per attempts partition that can hold it, and the row rewritten
# only when a value changes. Attempts are partitioned by day and kept for the retention
# window (90 days by default), so a lookup without bounds grows with the days kept (and
# reads the week created ahead): an attempt is looked for from its delivery's creation
# less an hour (as stored: this batch's rows are inserted before, and a duplicate's newer
# creation is not; no row, nothing to update, no partition read) to a day past
# PostgreSQL's clock, which leaves one to three partitions. An attempt stamped outside
# that range -- by a clock more than an hour behind fan-out's or a day ahead of
# PostgreSQL's -- is stored but not counted here. The new values are computed from the
# row being updated (``d``), so PostgreSQL re-evaluates them on the latest version if a
# concurrent writer got there first (an attempt count is never lowered). It replaced four
# statements joining ``delivery_id = ANY(ids)`` subqueries, for which the planner,
# misjudging how many rows an id has, picked a hash join over a sequential scan of all of
# ``deliveries`` (100 ms per flush at 300,000 rows, growing with the table); and each row
# changed was written twice (status, then attempt count), each time through every index.
# ``deliveries`` is partitioned by day of creation: each id's creation time comes from
# ``delivery_keys`` (one index probe), so the row is looked up in its own day's partition
# (run-time pruning) rather than in every day kept.
_STATUS = "coalesce(n.kind, d.status)"
_STATUS_AT = "coalesce(n.occurred_at, d.status_at)"
_HELD_AT = "CASE WHEN n.kind = 'held' THEN n.occurred_at ELSE d.held_at END"
_HOLD_REASON = "CASE WHEN n.kind = 'held' THEN n.reason ELSE d.hold_reason END"
_ATTEMPTS = "CASE WHEN n.n >= d.attempt_count THEN n.n ELSE d.attempt_count END"
_LAST_ERROR = "CASE WHEN n.n >= d.attempt_count THEN n.err ELSE d.last_error END"
PROJECT = f"""
UPDATE deliveries d
   SET status = {_STATUS}, status_at = {_STATUS_AT}, held_at = {_HELD_AT},
       hold_reason = {_HOLD_REASON}, attempt_count = {_ATTEMPTS}, last_error = {_LAST_ERROR}
  FROM (SELECT ids.delivery_id, c.created_at, o.kind, o.occurred_at, o.reason, a.n, a.err
          FROM unnest(%(ids)s::text[]) AS ids(delivery_id)
          CROSS JOIN LATERAL (SELECT (
               SELECT k.created_at FROM delivery_keys k
                WHERE k.delivery_id = ids.delivery_id) AS created_at) c
          CROSS JOIN LATERAL (SELECT coalesce(c.created_at
               - interval '{_CLOCK_SLACK.total_seconds():.0f} s', 'infinity') AS since) b
          LEFT JOIN LATERAL (
               SELECT kind, occurred_at, reason FROM delivery_outcomes x
                WHERE x.delivery_id = ids.delivery_id
                ORDER BY x.occurred_at DESC, x.outcome_id DESC LIMIT 1) o ON true
          LEFT JOIN LATERAL (
               SELECT attempt_no AS n, error_class AS err FROM delivery_attempts x
                WHERE x.delivery_id = ids.delivery_id
                  AND x.attempted_at >= b.since AND x.attempted_at < now() + interval '1 day'
                ORDER BY x.attempt_no DESC, x.attempted_at DESC LIMIT 1) a ON true
         WHERE o.kind IS NOT NULL OR a.n IS NOT NULL) n
 WHERE d.delivery_id = n.delivery_id AND d.created_at = n.created_at
   AND (d.status, d.status_at, d.held_at, d.hold_reason, d.attempt_count, d.last_error)
       IS DISTINCT FROM
       ({_STATUS}, {_STATUS_AT}, {_HELD_AT}, {_HOLD_REASON}, {_ATTEMPTS}, {_LAST_ERROR})
"""


def project_status(conn: psycopg.Connection[Any], delivery_ids: list[str],
                    suppressed: list[str] | None = None) -> None:
    """Re-derive the status projection of the touched deliveries from outcomes and attempts:
    status = the latest outcome's kind (by ``occurred_at``, then ``outcome_id``);
    held_at/hold_reason from it when it is ``held``; attempt_count/last_error from the
    highest attempt number, never lowered. ``suppressed``: this batch's ``suppressed``
    outcome ids (permanent mapping failures), which become postback_suppressions rows."""
    if delivery_ids:
        conn.execute(PROJECT, {"ids": delivery_ids})
    if suppressed:
        conn.execute(
            "INSERT INTO postback_suppressions (delivery_id, endpoint_id, reason, created_at)"
            " SELECT DISTINCT ON (delivery_id) delivery_id, endpoint_id, coalesce(reason, ''),"
            " occurred_at FROM delivery_outcomes WHERE outcome_id = ANY(%(ids)s)"
            " ORDER BY delivery_id, occurred_at ON CONFLICT (delivery_id) DO UPDATE SET"
            " reason = EXCLUDED.reason, created_at = EXCLUDED.created_at, created_by = NULL,"
            " resolved_at = NULL, resolved_by = NULL"  # suppressed again after a resolve
            " WHERE postback_suppressions.resolved_at IS NOT NULL"
            " AND postback_suppressions.resolved_at < EXCLUDED.created_at",
            {"ids": suppressed},
        )
