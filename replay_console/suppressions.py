"""Suppressions and dead-letter resolution: marking a poison delivery never to be sent
again, resolving a suppression (it may be replayed or re-rendered again), resolving a
dead letter. Each is checked against the principal's rights and audited."""

from __future__ import annotations

from typing import Any

import psycopg

from postbacks.db.delivery_keys import BY_ID
from replay_console.auth import Principal
from replay_console.rules import ActionError, audit, require

__all__ = ["resolve_dead_letter", "resolve_suppression", "suppress_delivery"]

_SUPPRESSIBLE = ("exhausted", "dead_lettered")


def suppress_delivery(conn: psycopg.Connection[Any], p: Principal, delivery_id: str,
                      reason: str) -> None:
    """Mark a poison delivery as never to be sent again (replays skip it). Only
    deliveries that are not in flight: exhausted or dead-lettered."""
    require(p, "suppress", "suppress deliveries")
    if not reason.strip():
        raise ActionError("a suppression needs a reason")
    row = conn.execute("SELECT endpoint_id, status FROM deliveries WHERE " + BY_ID +
                       " FOR UPDATE", {"id": delivery_id}).fetchone()
    if row is None:
        raise ActionError(f"no delivery {delivery_id!r}", 404)
    if row[1] not in _SUPPRESSIBLE:
        raise ActionError(f"delivery {delivery_id} is {row[1]}; only {', '.join(_SUPPRESSIBLE)}"
                          " deliveries can be suppressed", 409)
    done = conn.execute(  # a resolved suppression is opened again, with this reason
        "INSERT INTO postback_suppressions (delivery_id, endpoint_id, reason, created_by)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT (delivery_id) DO UPDATE SET"
        " reason = EXCLUDED.reason, created_by = EXCLUDED.created_by, created_at = now(),"
        " resolved_at = NULL, resolved_by = NULL"
        " WHERE postback_suppressions.resolved_at IS NOT NULL RETURNING 1",
        (delivery_id, row[0], reason.strip(), p.actor)).fetchone()
    if done is None:
        raise ActionError(f"delivery {delivery_id} is already suppressed", 409)
    audit(conn, p, "delivery.suppress", "delivery", delivery_id, {"status": row[1]},
           {"suppressed": True, "reason": reason.strip()})


def resolve_suppression(conn: psycopg.Connection[Any], p: Principal, delivery_id: str,
                        note: str | None) -> None:
    """Mark a suppression resolved (it stays, with who resolved it and when): the
    delivery may be replayed again (a render failure: re-rendered with the fixed config)."""
    require(p, "suppress", "resolve suppressions")
    row = conn.execute(
        "UPDATE postback_suppressions SET resolved_at = now(), resolved_by = %s"
        " WHERE delivery_id = %s AND resolved_at IS NULL RETURNING reason",
        (p.actor, delivery_id)).fetchone()
    if row is None:
        exists = conn.execute("SELECT 1 FROM postback_suppressions WHERE delivery_id = %s",
                              (delivery_id,)).fetchone()
        raise ActionError(f"the suppression of {delivery_id} is already resolved" if exists
                          else f"delivery {delivery_id!r} is not suppressed",
                          409 if exists else 404)
    audit(conn, p, "suppression.resolve", "delivery", delivery_id,
          {"resolved": False, "reason": row[0]}, {"resolved": True}, note)


def resolve_dead_letter(conn: psycopg.Connection[Any], p: Principal, dead_letter_id: str,
                        note: str | None) -> None:
    """Mark a dead letter handled (it stays, with who resolved it and when)."""
    require(p, "suppress", "resolve dead letters")
    row = conn.execute(
        "UPDATE dead_letters SET resolved_at = now(), resolved_by = %s"
        " WHERE dead_letter_id = %s AND resolved_at IS NULL RETURNING reason",
        (p.actor, dead_letter_id)).fetchone()
    if row is None:
        exists = conn.execute("SELECT 1 FROM dead_letters WHERE dead_letter_id = %s",
                              (dead_letter_id,)).fetchone()
        raise ActionError(f"dead letter {dead_letter_id} is already resolved" if exists
                          else f"no dead letter {dead_letter_id!r}", 409 if exists else 404)
    audit(conn, p, "dead_letter.resolve", "dead_letter", dead_letter_id,
           {"resolved": False, "reason": row[0]}, {"resolved": True}, note)
