"""Anomaly gate state in PostgreSQL: modes, durable halts, held cohorts, audit.

``payout_anomaly_settings`` holds one row per (scope, scope_key, detector): the arming mode
(``off``/``detect``/``enforce``; a missing row reads as off), the detector's params, and
the durable halt state. A trip moves ``closed -> tripped`` (:func:`record_trip`, the gate);
only a person moves it back (:func:`close_halt`) — never a timer, restart or cache flush.
Every change writes an ``audit_log`` row in the same transaction.

Each writing function runs in ``conn.transaction()``: on an idle connection it commits when
it returns; inside a transaction the caller opened, it is a savepoint and the caller
commits (so a caller can, e.g., publish to Kafka before committing).

Held deliveries are ``deliveries`` rows with ``status = 'held'`` (projected by the sink from
``held`` outcomes). A release or reject is audited at once but reaches ``status`` only when
the sink projects its outcome; :func:`held_deliveries` leaves such deliveries out, so a
cohort is never resolved twice. :func:`publisher_deliveries` is the publisher-scoped view:
held and rejected deliveries are excluded **in the query**.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.core.anomaly.modes import Detector, HaltState, Mode
from postbacks.db.anomaly_params import validate_params
from postbacks.db.times import ms_of, ts_of

__all__ = [
    "GLOBAL_KEY",
    "SCOPES",
    "AnomalyRow",
    "HeldDelivery",
    "NotTripped",
    "audit_held",
    "close_halt",
    "endpoint_exists",
    "held_cohorts",
    "held_deliveries",
    "load_rows",
    "lock_held",
    "publisher_deliveries",
    "record_trip",
    "set_mode",
    "validate_params",
]

SCOPES = ("endpoint", "global")
GLOBAL_KEY = "*"  # the default global scope_key (Settings.anomaly_global_key)
SYSTEM_ACTOR_PREFIX = "system:"
_HELD_LOCK = 7_424_611_001  # pg advisory lock serialising held-cohort resolutions


class NotTripped(ValueError):
    """``close_halt`` on a scope that is not tripped."""


@dataclass(frozen=True, slots=True)
class AnomalyRow:
    scope: str
    scope_key: str
    detector: str
    mode: str
    params: dict[str, Any]
    state: str
    state_changed_at_ms: int | None
    state_reason: str | None

    @property
    def target_id(self) -> str:
        """``scope/scope_key/detector``: the audit target and the control-topic key."""
        return f"{self.scope}/{self.scope_key}/{self.detector}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class HeldDelivery:
    delivery_id: str
    endpoint_id: str
    app_id: str
    idempotency_key: str
    hold_reason: str | None
    held_at_ms: int | None
    payout_usd_micros: int | None
    attempt_count: int
    created_at_ms: int
    snapshot: dict[str, Any]  # the ConversionEvent as stored by the sink


_COLS = "scope, scope_key, detector, mode, params, state, state_changed_at, state_reason"


def _row(r: Sequence[Any]) -> AnomalyRow:
    return AnomalyRow(r[0], r[1], r[2], r[3], dict(r[4] or {}), r[5], ms_of(r[6]), r[7])


def _check_target(scope: str, scope_key: str, detector: str) -> None:
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if not scope_key.strip():
        raise ValueError(f"the {scope} scope needs a key: the endpoint id, or the global key "
                         f"({GLOBAL_KEY!r} unless POSTBACKS_ANOMALY_GLOBAL_KEY says otherwise)")
    if detector not in set(Detector):
        raise ValueError(f"unknown detector {detector!r}: expected one of "
                         f"{', '.join(d.value for d in Detector)}")


def _check_actor(actor: str) -> None:
    if not actor or not actor.strip():
        raise ValueError("an actor is required (who is making this change)")
    if len(actor.strip()) > 200 or any(ch < " " or ch == "\x7f" for ch in actor):
        raise ValueError("the actor must be at most 200 characters, no control characters")


def _audit(conn: psycopg.Connection[Any], *, actor: str, action: str, target_type: str,
           target_id: str, before: Any, after: Any, note: str | None) -> None:
    conn.execute(
        "INSERT INTO audit_log (actor, action, target_type, target_id, before, after, note)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (actor, action, target_type, target_id,
         None if before is None else Jsonb(before), None if after is None else Jsonb(after),
         note),
    )


def _locked(conn: psycopg.Connection[Any], scope: str, scope_key: str,
            detector: str) -> AnomalyRow | None:
    r = conn.execute(
        f"SELECT {_COLS} FROM payout_anomaly_settings"
        " WHERE scope = %s AND scope_key = %s AND detector = %s FOR UPDATE",
        (scope, scope_key, detector),
    ).fetchone()
    return None if r is None else _row(r)


def load_rows(conn: psycopg.Connection[Any]) -> list[AnomalyRow]:
    """Every settings row (modes, params, halt states)."""
    return [_row(r) for r in conn.execute(
        f"SELECT {_COLS} FROM payout_anomaly_settings ORDER BY scope DESC, scope_key, detector"
    )]


def endpoint_exists(conn: psycopg.Connection[Any], endpoint_id: str) -> bool:
    return conn.execute("SELECT 1 FROM endpoints WHERE endpoint_id = %s",
                        (endpoint_id,)).fetchone() is not None


def set_mode(
    conn: psycopg.Connection[Any], *, scope: str, scope_key: str, detector: str, mode: str,
    params: Mapping[str, Any] | None = None, actor: str, note: str | None = None,
) -> AnomalyRow:
    """Set the mode (and merge ``params`` over the stored ones); audited ``anomaly.set_mode``.
    Never changes the halt state."""
    _check_target(scope, scope_key, detector)
    if mode not in set(Mode):
        raise ValueError(f"unknown mode {mode!r}: expected one of "
                         f"{', '.join(m.value for m in Mode)}")
    _check_actor(actor)
    checked = validate_params(detector, params or {})
    with conn.transaction():
        before = _locked(conn, scope, scope_key, detector)
        r = conn.execute(
            "INSERT INTO payout_anomaly_settings (scope, scope_key, detector, mode, params)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (scope, scope_key, detector) DO UPDATE"
            " SET mode = EXCLUDED.mode,"
            " params = payout_anomaly_settings.params || EXCLUDED.params"
            f" RETURNING {_COLS}",
            (scope, scope_key, detector, mode, Jsonb(checked)),
        ).fetchone()
        assert r is not None
        after = _row(r)
        _audit(conn, actor=actor, action="anomaly.set_mode", target_type="anomaly_setting",
               target_id=after.target_id, before=before and before.to_json(),
               after=after.to_json(), note=note)
    return after


def record_trip(
    conn: psycopg.Connection[Any], *, scope: str, scope_key: str, detector: str, reason: str,
    observed: float | None, baseline: float | None, at_ms: int,
    actor: str = "system:anomaly-gate",
) -> bool:
    """``closed -> tripped`` (audited ``anomaly.trip``); False, and nothing written, when it
    is already tripped. A missing row is created (mode ``off``); an existing mode is kept."""
    _check_target(scope, scope_key, detector)
    with conn.transaction():
        before = _locked(conn, scope, scope_key, detector)
        if before is not None and (before.state == HaltState.TRIPPED or (
                before.state_changed_at_ms is not None and before.state_changed_at_ms >= at_ms)):
            return False  # already tripped, or a later human close supersedes this trip
        r = conn.execute(
            "INSERT INTO payout_anomaly_settings (scope, scope_key, detector, state,"
            " state_changed_at, state_reason) VALUES (%s, %s, %s, 'tripped', %s, %s)"
            " ON CONFLICT (scope, scope_key, detector) DO UPDATE SET state = 'tripped',"
            " state_changed_at = EXCLUDED.state_changed_at,"
            " state_reason = EXCLUDED.state_reason"
            " WHERE payout_anomaly_settings.state = 'closed'"
            " AND (payout_anomaly_settings.state_changed_at IS NULL"
            "      OR payout_anomaly_settings.state_changed_at < EXCLUDED.state_changed_at)"
            f" RETURNING {_COLS}",
            (scope, scope_key, detector, ts_of(at_ms), reason),
        ).fetchone()
        if r is None:  # a concurrent trip inserted the row first
            return False
        after = _row(r)
        _audit(conn, actor=actor, action="anomaly.trip", target_type="anomaly_setting",
               target_id=after.target_id, before=before and before.to_json(),
               after={**after.to_json(), "observed": observed, "baseline": baseline},
               note=reason)
    return True


def close_halt(
    conn: psycopg.Connection[Any], *, scope: str, scope_key: str, detector: str, actor: str,
    note: str,
) -> AnomalyRow:
    """``tripped -> closed`` by a person (audited ``anomaly.close``); :class:`NotTripped`
    when the scope is not tripped. ``actor`` must name a person, not a ``system:`` job."""
    _check_target(scope, scope_key, detector)
    _check_actor(actor)
    if actor.strip().lower().startswith(SYSTEM_ACTOR_PREFIX):
        raise ValueError(f"a halt is closed by a person, not by {actor!r}")
    if not note or not note.strip():
        raise ValueError("a note is required to close a halt (why it is safe to resume)")
    with conn.transaction():
        before = _locked(conn, scope, scope_key, detector)
        if before is None or before.state != HaltState.TRIPPED:
            state = "no settings row" if before is None else f"state {before.state}"
            raise NotTripped(f"{scope}/{scope_key}/{detector} is not tripped ({state})")
        r = conn.execute(
            "UPDATE payout_anomaly_settings SET state = 'closed',"
            " state_changed_at = clock_timestamp(), state_reason = %s"
            " WHERE scope = %s AND scope_key = %s AND detector = %s"
            f" RETURNING {_COLS}",
            (f"closed by {actor}: {note}", scope, scope_key, detector),
        ).fetchone()
        assert r is not None
        after = _row(r)
        _audit(conn, actor=actor, action="anomaly.close", target_type="anomaly_setting",
               target_id=after.target_id, before=before.to_json(), after=after.to_json(),
               note=note)
    return after


def _held_where(endpoint_id: str | None, reason: str | None, app_id: str | None,
                delivery_ids: Sequence[str] | None,
                held_until_ms: int | None = None) -> tuple[str, list[Any]]:
    where = ["d.status = 'held'"]
    args: list[Any] = []
    if held_until_ms is not None:  # held no later than that millisecond (the page's newest)
        where.append("(d.held_at IS NULL OR d.held_at < to_timestamp(%s / 1000.0))")
        args.append(held_until_ms + 1)
    for column, value in (("endpoint_id", endpoint_id), ("hold_reason", reason),
                          ("app_id", app_id)):
        if value is not None:
            where.append(f"d.{column} = %s")
            args.append(value)
    if delivery_ids is not None:
        where.append("d.delivery_id = ANY(%s)")
        args.append(list(delivery_ids))
    where.append(
        "NOT EXISTS (SELECT 1 FROM audit_log a WHERE a.target_type = 'delivery'"
        " AND a.target_id = d.delivery_id AND a.action IN ('held.release', 'held.reject')"
        " AND (d.held_at IS NULL OR a.at >= d.held_at))"
    )
    return " AND ".join(where), args


def held_deliveries(
    conn: psycopg.Connection[Any], *, endpoint_id: str | None = None,
    reason: str | None = None, app_id: str | None = None,
    delivery_ids: Sequence[str] | None = None, limit: int = 1000,
    held_until_ms: int | None = None,
) -> list[HeldDelivery]:
    """Held deliveries matching every given filter, oldest hold first. Deliveries already
    released or rejected (audited, not yet projected by the sink) are left out, and with
    ``held_until_ms`` those held after that millisecond."""
    where, args = _held_where(endpoint_id, reason, app_id, delivery_ids, held_until_ms)
    rows = conn.execute(
        "SELECT d.delivery_id, d.endpoint_id, d.app_id, d.idempotency_key, d.hold_reason,"
        " d.held_at, d.payout_usd_micros, d.attempt_count, d.created_at, d.snapshot"
        f" FROM deliveries d WHERE {where}"
        " ORDER BY d.held_at NULLS FIRST, d.delivery_id LIMIT %s",
        (*args, limit),
    ).fetchall()
    return [
        HeldDelivery(r[0], r[1], r[2], r[3], r[4], ms_of(r[5]), r[6], r[7], ms_of(r[8]) or 0,
                     dict(r[9]))
        for r in rows
    ]


def held_cohorts(
    conn: psycopg.Connection[Any], *, endpoint_id: str | None = None,
    reason: str | None = None, app_id: str | None = None, limit: int = 500,
) -> list[dict[str, Any]]:
    """Held deliveries grouped by (endpoint, hold reason): count, payout, oldest hold —
    the same selection :func:`held_deliveries` (and so a release or reject) makes."""
    where, args = _held_where(endpoint_id, reason, app_id, None)
    return [
        {"endpoint_id": r[0], "hold_reason": r[1], "count": int(r[2]),
         "payout_usd_micros": int(r[3] or 0), "oldest_ms": ms_of(r[4]),
         "newest_ms": ms_of(r[5])}
        for r in conn.execute(
            "SELECT d.endpoint_id, d.hold_reason, count(*), sum(d.payout_usd_micros),"
            f" min(d.held_at), max(d.held_at) FROM deliveries d WHERE {where}"
            " GROUP BY d.endpoint_id, d.hold_reason ORDER BY min(d.held_at) NULLS FIRST"
            " LIMIT %s", (*args, limit))
    ]


def lock_held(conn: psycopg.Connection[Any]) -> None:
    """Serialise held-cohort resolutions until the current transaction ends (two operators
    releasing the same cohort at once must not both publish it)."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_HELD_LOCK,))


def audit_held(
    conn: psycopg.Connection[Any], held: Sequence[HeldDelivery], *, action: str, actor: str,
    after: Mapping[str, Any], note: str | None,
) -> int:
    """One audit row per delivery (``held.release`` / ``held.reject``)."""
    _check_actor(actor)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO audit_log (actor, action, target_type, target_id, before, after,"
            " note) VALUES (%s, %s, 'delivery', %s, %s, %s, %s)",
            [(actor, action, h.delivery_id,
              Jsonb({"status": "held", "hold_reason": h.hold_reason}), Jsonb(dict(after)),
              note) for h in held],
        )
    return len(held)


def publisher_deliveries(
    conn: psycopg.Connection[Any], *, app_ids: Sequence[str], limit: int = 100,
) -> list[dict[str, Any]]:
    """A publisher's view: its apps' deliveries, newest first. Held and rejected deliveries
    never appear (excluded in the WHERE clause), nor do hold reasons. Nor do ``pending``
    ones: a delivery the gate holds is ``pending`` until the sink has its ``held`` outcome,
    so a publisher sees a delivery once it has a first outcome."""
    rows = conn.execute(
        "SELECT delivery_id, endpoint_id, app_id, conversion_id, event_type, goal_id,"
        " idempotency_key, payout_usd_micros, status, status_at, attempt_count, created_at"
        " FROM deliveries WHERE app_id = ANY(%s) AND status NOT IN ('pending', 'held', 'rejected')"
        " ORDER BY created_at DESC, delivery_id LIMIT %s",
        (list(app_ids), limit),
    ).fetchall()
    return [
        {"delivery_id": r[0], "endpoint_id": r[1], "app_id": r[2], "conversion_id": r[3],
         "event_type": r[4], "goal_id": r[5], "idempotency_key": r[6],
         "payout_usd_micros": r[7], "status": r[8], "status_at_ms": ms_of(r[9]),
         "attempt_count": r[10], "created_at_ms": ms_of(r[11])}
        for r in rows
    ]
