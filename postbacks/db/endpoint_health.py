"""``endpoint_health`` (kept by the sink) and the auto-disable state on ``endpoints``.

See :mod:`postbacks.core.endpoint_health` for the rules; :func:`record_batch` is the sink's
SQL form of :func:`~postbacks.core.endpoint_health.merge`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from postbacks.core.endpoint_health import BatchHealth, Health
from postbacks.db.times import ms_of, ts_of

__all__ = ["Candidate", "candidates", "disable", "enable", "record_batch"]

_UPSERT = """
INSERT INTO endpoint_health AS h (endpoint_id, last_success_at, failing_since, last_gone_at)
VALUES (%(ep)s, %(success)s, %(failing)s, %(gone)s)
ON CONFLICT (endpoint_id) DO UPDATE SET
    failing_since = CASE
        WHEN EXCLUDED.last_success_at IS NOT NULL
             AND EXCLUDED.last_success_at >= coalesce(h.last_success_at, EXCLUDED.last_success_at)
        THEN EXCLUDED.failing_since
        ELSE coalesce(h.failing_since, EXCLUDED.failing_since) END,
    last_success_at = greatest(h.last_success_at, EXCLUDED.last_success_at),
    last_gone_at = greatest(h.last_gone_at, EXCLUDED.last_gone_at),
    updated_at = now()
"""


def record_batch(conn: psycopg.Connection[Any], batch: Mapping[str, BatchHealth]) -> None:
    """Merge one flush's health into ``endpoint_health``, in the caller's transaction
    (endpoints in id order: two sinks never lock the same rows the other way round)."""
    if not batch:
        return
    with conn.cursor() as cur:
        cur.executemany(_UPSERT, [
            {"ep": ep, "success": ts_of(b.last_success_ms), "failing": ts_of(b.failing_since_ms),
             "gone": ts_of(b.last_gone_ms)}
            for ep, b in sorted(batch.items())])


@dataclass(frozen=True, slots=True)
class Candidate:
    endpoint_id: str
    app_id: str
    health: Health
    disable_on_gone: bool


def candidates(conn: psycopg.Connection[Any]) -> list[Candidate]:
    """Enabled endpoints, not disabled, that are failing or have seen a 410 Gone."""
    rows = conn.execute(
        "SELECT e.endpoint_id, e.app_id, h.last_success_at, h.failing_since, h.last_gone_at,"
        " coalesce((e.config ->> 'disable_on_gone')::boolean, false)"
        " FROM endpoint_health h JOIN endpoints e USING (endpoint_id)"
        " WHERE e.enabled AND e.disabled_at IS NULL"
        "   AND (h.failing_since IS NOT NULL OR h.last_gone_at IS NOT NULL)"
        " ORDER BY e.endpoint_id").fetchall()
    return [Candidate(ep, app, Health(ms_of(s), ms_of(f), ms_of(g)), bool(gone))
            for ep, app, s, f, g, gone in rows]


def _audit(conn: psycopg.Connection[Any], actor: str, action: str, endpoint_id: str,
           before: Mapping[str, Any], after: Mapping[str, Any], note: str | None) -> None:
    conn.execute(
        "INSERT INTO audit_log (actor, action, target_type, target_id, before, after, note)"
        " VALUES (%s, %s, 'endpoint', %s, %s, %s, %s)",
        (actor, action, endpoint_id, json.dumps(before), json.dumps(after), note))


def disable(conn: psycopg.Connection[Any], endpoint_id: str, reason: str) -> bool:
    """Disable it (if it still is enabled and not disabled), with an audit row; True when
    this call disabled it. Commits."""
    with conn.transaction():
        row = conn.execute(
            "UPDATE endpoints SET disabled_at = now(), disabled_reason = %s, updated_at = now()"
            " WHERE endpoint_id = %s AND enabled AND disabled_at IS NULL RETURNING endpoint_id",
            (reason, endpoint_id)).fetchone()
        if row is None:
            return False
        _audit(conn, "system:monitor", "endpoint.disabled", endpoint_id, {"disabled": False},
               {"disabled": True, "reason": reason}, None)
    return True


def enable(conn: psycopg.Connection[Any], endpoint_id: str, *, actor: str, backlog: str,
           note: str | None) -> str | None:
    """Re-enable a disabled endpoint (audited, its failure history cleared so it is not
    disabled again at once); returns the reason it had been disabled for, or None when it
    was not disabled. Commits."""
    with conn.transaction():
        row = conn.execute(
            "UPDATE endpoints e SET disabled_at = NULL, disabled_reason = NULL,"
            " updated_at = now() FROM (SELECT endpoint_id, disabled_reason FROM endpoints"
            " WHERE endpoint_id = %s AND disabled_at IS NOT NULL FOR UPDATE) old"
            " WHERE e.endpoint_id = old.endpoint_id RETURNING old.disabled_reason",
            (endpoint_id,)).fetchone()
        if row is None:
            return None
        conn.execute("UPDATE endpoint_health SET failing_since = NULL, last_gone_at = NULL,"
                     " updated_at = now() WHERE endpoint_id = %s", (endpoint_id,))
        _audit(conn, actor, "endpoint.enabled", endpoint_id,
               {"disabled": True, "reason": row[0]}, {"disabled": False, "backlog": backlog},
               note)
    return str(row[0])
