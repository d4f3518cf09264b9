"""The console's reads: the same queries behind the pages, the JSON API and the CLI.

Every function takes the :class:`~replay_console.auth.Principal` asking. A publisher's
scope is enforced **in the SQL**: its own apps only, and never a delivery that is held,
released (re-driven, in flight again), rejected or not yet projected (``pending`` — a
delivery the gate holds is pending until the sink has its ``held`` outcome); hold reasons,
hold times and source snapshots are not selected for it, its outcome history leaves out
the hold, release and rejection, and an attempt a release re-drove reads as a ``retry``.
Nothing a publisher is shown tells that a delivery was ever held. Lists page by keyset on
``(created_at, delivery_id)`` (indexes in migration 0002), so a page costs the same on
page 1 and page 10,000.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg

from postbacks.db.times import ms_of, ts_of
from replay_console.auth import Principal, may
from replay_console.filters import (  # the filter names are re-exported (reads API)
    ID,
    MAX_PAGE,
    PUBLISHER_STATUSES,
    STATUSES,
    DeadLetterFilter,
    DeliveryFilter,
    FilterError,
    parse_dead_letter_filter,
    parse_filter,
)

__all__ = [
    "PUBLISHER_STATUSES",
    "STATUSES",
    "DeadLetterFilter",
    "DeliveryFilter",
    "FilterError",
    "NotFound",
    "audit_rows",
    "dead_letters",
    "delivery_detail",
    "endpoint_detail",
    "list_deliveries",
    "masked_config",
    "parse_dead_letter_filter",
    "parse_filter",
    "suppressions",
]

_HTTP_FAMILY = re.compile(r"http_([1-5])xx")  # an error filter naming a status family
_HIDDEN_FROM_PUBLISHERS = ("pending", "held", "released", "rejected")  # statuses and outcomes
_PUBLISHER_TRIGGER = {"release": "retry"}  # what a publisher reads as an attempt's trigger


class NotFound(LookupError):
    """No such thing, or not visible to the principal (404 either way: a publisher cannot
    probe for other apps' ids)."""


def _scope(p: Principal, where: list[str], args: list[Any], alias: str = "d") -> None:
    """The principal's visibility, as SQL."""
    if p.is_publisher:
        if len(p.app_ids) == 1:  # `=`: the (app_id, created_at, delivery_id) index orders it
            where.append(f"{alias}.app_id = %s")
            args.append(p.app_ids[0])
        else:
            where.append(f"{alias}.app_id = ANY(%s)")
            args.append(list(p.app_ids))
        where.append(f"{alias}.status <> ALL(%s)")
        args.append(list(_HIDDEN_FROM_PUBLISHERS))
    elif not may(p, "read_internal"):
        where.append("false")


def filter_sql(p: Principal, f: DeliveryFilter, *, paging: bool = True
               ) -> tuple[str, list[Any]]:
    """The WHERE clause (and its args) for ``f`` as ``p`` may see it."""
    where: list[str] = []
    args: list[Any] = []
    _scope(p, where, args)
    for column, value in (("app_id", f.app), ("endpoint_id", f.endpoint),
                          ("status", f.status)):
        if value is not None:
            where.append(f"d.{column} = %s")
            args.append(value)
    if f.error is not None:
        family = _HTTP_FAMILY.fullmatch(f.error)
        if family:  # http_5xx: every http_5NN (an HTTP answer's class is http_<status>)
            where.append("d.last_error LIKE %s")
            args.append(f"http\\_{family.group(1)}__")
        else:
            where.append("d.last_error = %s")
            args.append(f.error)
    if f.q is not None:  # each arm is an index lookup (primary key; migration 0007)
        where.append("(d.delivery_id = %s OR d.conversion_id = %s OR d.idempotency_key = %s)")
        args += [f.q, f.q, f.q]
    if f.since_ms is not None:
        where.append("d.created_at >= %s")
        args.append(ts_of(f.since_ms))
    if f.until_ms is not None:
        where.append("d.created_at < %s")
        args.append(ts_of(f.until_ms))
    if paging and f.cursor is not None:
        where.append("(d.created_at, d.delivery_id) < (%s, %s)")
        args += [ts_of(f.cursor[0]), f.cursor[1]]
    return (" AND ".join(where) or "true"), args


_LIST_COLUMNS = (
    "d.delivery_id, d.endpoint_id, d.app_id, d.conversion_id, d.event_type, d.goal_id,"
    " d.idempotency_key, d.payout_usd_micros, d.status, d.status_at, d.attempt_count,"
    " d.last_error, d.created_at"
)


def _list_row(r: tuple[Any, ...], p: Principal, hold_reason: str | None) -> dict[str, Any]:
    out = {
        "delivery_id": r[0], "endpoint_id": r[1], "app_id": r[2], "conversion_id": r[3],
        "event_type": r[4], "goal_id": r[5], "idempotency_key": r[6],
        "payout_usd_micros": r[7], "status": r[8], "status_at_ms": ms_of(r[9]),
        "attempt_count": r[10], "last_error": r[11], "created_at_ms": ms_of(r[12]),
    }
    if not p.is_publisher:
        out["hold_reason"] = hold_reason
    return out


def list_deliveries(conn: psycopg.Connection[Any], p: Principal, f: DeliveryFilter
                    ) -> tuple[list[dict[str, Any]], str | None]:
    """One page, newest first, and the cursor of the next page (None on the last)."""
    where, args = filter_sql(p, f)
    hold = "NULL" if p.is_publisher else "d.hold_reason"
    rows = conn.execute(
        f"SELECT {_LIST_COLUMNS}, {hold} FROM deliveries d WHERE {where}"
        " ORDER BY d.created_at DESC, d.delivery_id DESC LIMIT %s",
        (*args, f.limit + 1),
    ).fetchall()
    page = [_list_row(r[:13], p, r[13]) for r in rows[: f.limit]]
    nxt = None
    if len(rows) > f.limit and page:
        last = page[-1]
        nxt = f"{last['created_at_ms']}:{last['delivery_id']}"
    return page, nxt


def count_deliveries(conn: psycopg.Connection[Any], p: Principal, f: DeliveryFilter,
                     cap: int) -> int:
    """How many match ``f`` (ignoring the cursor), counting at most ``cap`` + 1."""
    where, args = filter_sql(p, f, paging=False)
    row = conn.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM deliveries d WHERE {where} LIMIT %s) x",
        (*args, cap + 1),
    ).fetchone()
    return int(row[0]) if row else 0


def delivery_detail(conn: psycopg.Connection[Any], p: Principal, delivery_id: str
                    ) -> dict[str, Any]:
    """A delivery with every attempt's exact request and response excerpt, its outcomes,
    dead letters, replays and audit trail. Raises :class:`NotFound`."""
    if not ID.match(delivery_id):
        raise NotFound(f"no delivery {delivery_id[:80]!r}")
    where, args = ["d.delivery_id = %s"], [delivery_id]
    _scope(p, where, args)
    snap = "NULL::jsonb" if p.is_publisher else "d.snapshot"
    hold = "NULL" if p.is_publisher else "d.hold_reason"
    row = conn.execute(
        f"SELECT {_LIST_COLUMNS}, {hold}, {snap}, d.event_id, d.held_at"
        f" FROM deliveries d WHERE {' AND '.join(where)}", args,
    ).fetchone()
    if row is None:
        raise NotFound(f"no delivery {delivery_id!r}")
    out = _list_row(row[:13], p, row[13])
    out["event_id"] = row[15]
    if not p.is_publisher:
        out["snapshot"] = row[14]
        out["held_at_ms"] = ms_of(row[16])
    out["attempts"] = [
        {"attempt_id": a[0], "attempted_at_ms": ms_of(a[1]), "attempt_no": a[2],
         "trigger": _PUBLISHER_TRIGGER.get(a[3], a[3]) if p.is_publisher else a[3],
         "result": a[4], "status_code": a[5], "error_class": a[6],
         "error_message": a[7], "queue_ms": a[8], "platform_ms": a[9], "wire_ms": a[10],
         "request_method": a[11], "request_url": a[12], "request_headers": a[13],
         "request_body": bytes(a[14]).decode("utf-8", "replace") if a[14] else "",
         "response_excerpt": bytes(a[15]).decode("utf-8", "replace") if a[15] else ""}
        for a in conn.execute(
            "SELECT attempt_id, attempted_at, attempt_no, trigger, result, status_code,"
            " error_class, error_message, queue_ms, platform_ms, wire_ms, request_method,"
            " request_url, request_headers, request_body, response_excerpt"
            " FROM delivery_attempts WHERE delivery_id = %s ORDER BY attempted_at, attempt_no",
            (delivery_id,),
        )
    ]
    hidden = list(_HIDDEN_FROM_PUBLISHERS) if p.is_publisher else []
    out["outcomes"] = [
        {"kind": o[0], "attempt_no": o[1], "reason": None if p.is_publisher else o[2],
         "actor": None if p.is_publisher else o[3], "occurred_at_ms": ms_of(o[4])}
        for o in conn.execute(
            "SELECT kind, attempt_no, reason, actor, occurred_at FROM delivery_outcomes"
            " WHERE delivery_id = %s AND kind <> ALL(%s) ORDER BY occurred_at, outcome_id",
            (delivery_id, hidden),
        )
    ]
    if not p.is_publisher:
        out["dead_letters"] = [
            {"dead_letter_id": r[0], "reason": r[1], "error_class": r[2],
             "error_message": r[3], "stage": r[4], "occurred_at_ms": ms_of(r[5]),
             "resolved_at_ms": ms_of(r[6]), "resolved_by": r[7]}
            for r in conn.execute(
                "SELECT dead_letter_id, reason, error_class, error_message, stage,"
                " occurred_at, resolved_at, resolved_by FROM dead_letters"
                " WHERE delivery_id = %s ORDER BY occurred_at", (delivery_id,))
        ]
        out["audit"] = audit_rows(conn, target_type="delivery", target_id=delivery_id)
        sup = conn.execute("SELECT reason, created_at, created_by, resolved_at, resolved_by"
                           " FROM postback_suppressions WHERE delivery_id = %s",
                           (delivery_id,)).fetchone()
        out["suppression"] = None if sup is None else {
            "reason": sup[0], "created_at_ms": ms_of(sup[1]), "created_by": sup[2],
            "resolved_at_ms": ms_of(sup[3]), "resolved_by": sup[4]}
    return out


def masked_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """An endpoint config with custom header values hidden (they may carry credentials)."""
    out = dict(config)
    if isinstance(out.get("headers"), Mapping):
        out["headers"] = {k: "********" for k in out["headers"]}
    return out


def endpoint_detail(conn: psycopg.Connection[Any], p: Principal, endpoint_id: str
                    ) -> dict[str, Any]:
    """An endpoint: config, validator, secrets (ids and windows, never keys), health over
    the last hour, the breaker as the attempt log shows it, recent outcomes."""
    if not may(p, "read_internal") or not ID.match(endpoint_id):
        raise NotFound(f"no endpoint {endpoint_id[:80]!r}")
    row = conn.execute(
        "SELECT endpoint_id, app_id, publisher_id, name, url, method, provider, event_types,"
        " enabled, concurrency, config, created_at, updated_at FROM endpoints"
        " WHERE endpoint_id = %s", (endpoint_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no endpoint {endpoint_id!r}")
    out: dict[str, Any] = {
        "endpoint_id": row[0], "app_id": row[1], "publisher_id": row[2], "name": row[3],
        "url": row[4], "method": row[5], "provider": row[6], "event_types": list(row[7]),
        "enabled": row[8], "concurrency": row[9],
        "config": row[10] if may(p, "edit_endpoint") else masked_config(row[10] or {}),
        "created_at_ms": ms_of(row[11]), "updated_at_ms": ms_of(row[12]),
    }
    out["secrets"] = [
        {"secret_id": s[0], "active_from_ms": ms_of(s[1]), "active_until_ms": ms_of(s[2]),
         "active": bool(s[3])}
        for s in conn.execute(
            "SELECT secret_id, active_from, active_until,"
            " active_from <= now() AND (active_until IS NULL OR active_until > now())"
            " FROM endpoint_secrets WHERE endpoint_id = %s ORDER BY active_from",
            (endpoint_id,))
    ]
    out["health"] = {r[0]: r[1] for r in conn.execute(
        "SELECT result, count(*) FROM delivery_attempts WHERE endpoint_id = %s"
        " AND attempted_at > now() - interval '1 hour' GROUP BY result", (endpoint_id,))}
    recent = conn.execute(
        "SELECT result FROM delivery_attempts WHERE endpoint_id = %s"
        " AND attempted_at > now() - interval '1 day'"
        " ORDER BY attempted_at DESC LIMIT 100", (endpoint_id,)).fetchall()
    failures = 0
    for (result,) in recent:
        if result == "delivered":
            break
        failures += 1
    out["consecutive_failures"] = failures
    quarantined = conn.execute(
        "SELECT max(occurred_at) FROM delivery_outcomes WHERE endpoint_id = %s"
        " AND kind = 'quarantined'", (endpoint_id,)).fetchone()
    out["last_quarantined_at_ms"] = ms_of(quarantined[0]) if quarantined else None
    out["recent_outcomes"] = [
        {"delivery_id": o[0], "kind": o[1], "reason": o[2], "occurred_at_ms": ms_of(o[3])}
        for o in conn.execute(
            "SELECT delivery_id, kind, reason, occurred_at FROM delivery_outcomes"
            " WHERE endpoint_id = %s ORDER BY occurred_at DESC LIMIT 20", (endpoint_id,))
    ]
    out["audit"] = audit_rows(conn, target_type="endpoint", target_id=endpoint_id)
    return out


def dead_letters(conn: psycopg.Connection[Any], p: Principal,
                 f: DeadLetterFilter | None = None) -> dict[str, Any]:
    """One page of dead letters, newest first, under ``f``: the rows, the total that
    match and the count per reason of that total (staff only)."""
    f = f or DeadLetterFilter()
    if not may(p, "read_internal"):
        return {"dead_letters": [], "total": 0, "by_reason": {}}
    where: list[str] = ["resolved_at IS NULL"] if f.unresolved else []
    args: list[Any] = []
    for column, value in (("stage", f.stage), ("reason", f.reason),
                          ("endpoint_id", f.endpoint)):
        if value is not None:
            where.append(f"{column} = %s")
            args.append(value)
    if f.since_ms is not None:
        where.append("occurred_at >= %s")
        args.append(ts_of(f.since_ms))
    if f.until_ms is not None:
        where.append("occurred_at < %s")
        args.append(ts_of(f.until_ms))
    cond = " AND ".join(where) or "true"
    rows = [
        {"dead_letter_id": r[0], "reason": r[1], "error_class": r[2], "error_message": r[3],
         "stage": r[4], "origin": f"{r[5]}[{r[6]}]@{r[7]}", "delivery_id": r[8],
         "endpoint_id": r[9], "occurred_at_ms": ms_of(r[10]), "resolved_at_ms": ms_of(r[11]),
         "resolved_by": r[12]}
        for r in conn.execute(
            "SELECT dead_letter_id, reason, error_class, error_message, stage, origin_topic,"
            " origin_partition, origin_offset, delivery_id, endpoint_id, occurred_at,"
            f" resolved_at, resolved_by FROM dead_letters WHERE {cond}"
            " ORDER BY occurred_at DESC, dead_letter_id DESC LIMIT %s OFFSET %s",
            (*args, f.limit, f.offset))
    ]
    by_reason = {str(r[0]): int(r[1]) for r in conn.execute(
        f"SELECT reason, count(*) FROM dead_letters WHERE {cond}"
        " GROUP BY reason ORDER BY count(*) DESC, reason", args)}
    return {"dead_letters": rows, "total": sum(by_reason.values()), "by_reason": by_reason}


def suppressions(conn: psycopg.Connection[Any], p: Principal, *, limit: int = 100
                 ) -> list[dict[str, Any]]:
    if not may(p, "read_internal"):
        return []
    return [
        {"delivery_id": r[0], "endpoint_id": r[1], "reason": r[2], "created_at_ms": ms_of(r[3]),
         "created_by": r[4], "resolved_at_ms": ms_of(r[5]), "resolved_by": r[6]}
        for r in conn.execute(
            "SELECT delivery_id, endpoint_id, reason, created_at, created_by, resolved_at,"
            " resolved_by FROM postback_suppressions"
            " ORDER BY resolved_at IS NOT NULL, created_at DESC LIMIT %s",
            (min(limit, MAX_PAGE),))
    ]


def audit_rows(conn: psycopg.Connection[Any], *, target_type: str | None = None,
               target_id: str | None = None, actor: str | None = None,
               action: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    where, args = [], []
    for column, value in (("target_type", target_type), ("target_id", target_id),
                          ("actor", actor), ("action", action)):
        if value is not None:
            where.append(f"{column} = %s")
            args.append(value)
    return [
        {"audit_id": r[0], "at_ms": ms_of(r[1]), "actor": r[2], "action": r[3],
         "target_type": r[4], "target_id": r[5], "before": r[6], "after": r[7], "note": r[8]}
        for r in conn.execute(
            "SELECT audit_id, at, actor, action, target_type, target_id, before, after, note"
            f" FROM audit_log WHERE {' AND '.join(where) or 'true'}"
            " ORDER BY at DESC, audit_id DESC LIMIT %s", (*args, min(limit, MAX_PAGE)))
    ]
