"""Per-endpoint health: ``GET /api/v1/endpoints`` and the ``/endpoints`` page (a list), and
``GET /api/v1/endpoints/{id}/health`` (one endpoint).

Per endpoint the principal may see: its ``state``, the success rate (delivered attempts /
attempts) over the last hour and the last 24 h (``None`` with no attempts), the last
successful and failed attempt within the last 24 h, ``breaker``, ``backlog`` (deliveries not
settled) and, for staff, ``held`` (deliveries held by the anomaly gate).

``breaker`` is **derived from outcomes**: the circuit breaker itself lives in the delivery
agent's memory, so the console reads it as ``open`` when the endpoint had a
``quarantined`` outcome within the last breaker window (``POSTBACKS_BREAKER_OPEN_S``), else
``closed``.

``state``, the first rule that holds:

1. ``disabled``: the endpoint row has ``enabled = false`` (its owner switched it off) or a
   ``disabled_at`` (the platform disabled it: its deliveries are parked);
2. ``halted``: a ``payout_anomaly_settings`` row of scope ``endpoint`` for it is tripped;
3. ``quarantined``: the breaker is open;
4. ``degraded``: the 1-hour success rate is below 0.9 over at least 10 attempts;
5. ``healthy``.

A **publisher** sees its own apps' endpoints only, never ``halted`` nor ``held``: a halt and
the gate's holds are internal, so its endpoints show the state they would have without the
halt, its backlog counts only the deliveries it may see (the console's own delivery scope,
:func:`replay_console.queries.filter_sql`, which never shows it a held one), and
``state=halted`` is not a filter it may use.

One statement answers a page: the attempt aggregates read ``delivery_attempts`` of the last
24 h only (partitioned by day on ``attempted_at``, so older partitions are pruned), the
breaker reads the quarantined outcomes of the breaker window, the backlog the unsettled
deliveries, each grouped by endpoint once and joined to the page's endpoints — never a query
per endpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import psycopg
from aiohttp import web

from postbacks.db.times import ms_of
from replay_console import queries as q
from replay_console.auth import Principal, may
from replay_console.filters import ID, STATUSES, DeliveryFilter
from replay_console.http import Console, Handler, me
from replay_console.problem import Problem

__all__ = [
    "DEGRADED_BELOW",
    "DEGRADED_MIN_ATTEMPTS",
    "MAX_LIMIT",
    "SETTLED",
    "STATES",
    "HealthQuery",
    "add_health_routes",
    "endpoint_health",
    "list_health",
    "parse_health_query",
]

STATES = ("healthy", "degraded", "quarantined", "disabled", "halted")
_PUBLISHER_STATES = tuple(s for s in STATES if s != "halted")
# A delivery in one of these statuses needs nothing more: everything else is backlog.
SETTLED = ("delivered", "dead_lettered", "exhausted", "rejected", "suppressed")
# The unsettled statuses, spelled out so the backlog count can use deliveries_status_idx.
_UNSETTLED = tuple(s for s in STATUSES if s not in SETTLED)
DEGRADED_BELOW = 0.9
DEGRADED_MIN_ATTEMPTS = 10
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MAX_OFFSET = 1_000_000


@dataclass(frozen=True, slots=True)
class HealthQuery:
    state: str | None = None
    app_id: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0

    def to_params(self) -> dict[str, str]:
        """The filters as query parameters (no paging), for the page's links."""
        out: dict[str, str] = {}
        if self.state:
            out["state"] = self.state
        if self.app_id:
            out["app_id"] = self.app_id
        if self.limit != DEFAULT_LIMIT:
            out["limit"] = str(self.limit)
        return out


def _whole(name: str, raw: str, low: int, high: int) -> int:
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise Problem(400, f"{name} must be a whole number from {low} to {high}, "
                      f"not {raw[:60]!r}")
    return int(raw)


def parse_health_query(p: Principal, params: Mapping[str, str],
                       multi: Mapping[str, int] | None = None) -> HealthQuery:
    """Query parameters → a :class:`HealthQuery`; raises :class:`Problem` (400) naming the
    bad one. ``multi`` counts each parameter's occurrences (a repeated one is refused)."""
    allowed = ("state", "app_id", "limit", "offset")
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise Problem(400, f"unknown parameter(s): {', '.join(u[:40] for u in unknown)} "
                      f"(use {', '.join(allowed)})")
    for k, n in (multi or {}).items():
        if n > 1:
            raise Problem(400, f"{k} given {n} times: give it once")
    kw: dict[str, Any] = {}
    state = (params.get("state") or "").strip()
    if state:
        states = _PUBLISHER_STATES if p.is_publisher else STATES
        if state not in states:
            raise Problem(400, f"state must be one of {', '.join(states)}, not {state[:60]!r}")
        kw["state"] = state
    app = (params.get("app_id") or "").strip()
    if app:
        if not ID.match(app):
            raise Problem(400, f"app_id {app[:60]!r} is not a valid id")
        kw["app_id"] = app
    limit = (params.get("limit") or "").strip()
    if limit:
        kw["limit"] = _whole("limit", limit, 1, MAX_LIMIT)
    offset = (params.get("offset") or "").strip()
    if offset:
        kw["offset"] = _whole("offset", offset, 0, MAX_OFFSET)
    return HealthQuery(**kw)


def _endpoint_scope(p: Principal, where: list[str], args: list[Any]) -> None:
    """Which endpoint rows ``p`` may see: the app half of the console's delivery scope
    (:func:`replay_console.queries.filter_sql`) — a publisher its own apps', staff all —
    on the ``endpoints`` table (which has no delivery status to hide)."""
    if p.is_publisher:
        where.append("e.app_id = ANY(%s)")
        args.append(list(p.app_ids))
    elif not may(p, "read_internal"):
        where.append("false")


def _sql(p: Principal, breaker_open_s: float, *, endpoint_id: str | None, app_id: str | None,
         state: str | None, limit: int, offset: int) -> tuple[str, list[Any]]:
    staff = not p.is_publisher
    ep_where: list[str] = []
    ep_args: list[Any] = []
    _endpoint_scope(p, ep_where, ep_args)
    if endpoint_id is not None:
        ep_where.append("e.endpoint_id = %s")
        ep_args.append(endpoint_id)
    if app_id is not None:
        ep_where.append("e.app_id = %s")
        ep_args.append(app_id)
    # The backlog: the deliveries the principal may see (the console's own delivery scope).
    d_where, d_args = q.filter_sql(p, DeliveryFilter(), paging=False)
    halted = ("WHEN h.endpoint_id IS NOT NULL THEN 'halted'" if staff else "")
    halt_cte = (
        ", halt AS (SELECT DISTINCT s.scope_key AS endpoint_id FROM payout_anomaly_settings s"
        " WHERE s.scope = 'endpoint' AND s.state = 'tripped'"
        " AND s.scope_key IN (SELECT endpoint_id FROM eps))" if staff else "")
    halt_join = " LEFT JOIN halt h ON h.endpoint_id = eps.endpoint_id" if staff else ""
    halt_col = "h.endpoint_id IS NOT NULL" if staff else "false"
    held_col = "coalesce(dl.held, 0)" if staff else "NULL::bigint"
    state_where = "WHERE state = %s" if state is not None else ""
    # Without a state filter the page is known from the endpoints alone: aggregate only its
    # endpoints. With one, every visible endpoint's state decides which rows make the page.
    eps_page = "ORDER BY e.endpoint_id LIMIT %s OFFSET %s" if state is None else ""
    sql = f"""
WITH eps AS (
  SELECT e.endpoint_id, e.app_id, e.name, e.enabled AND e.disabled_at IS NULL AS enabled
    FROM endpoints e
   WHERE {' AND '.join(ep_where) or 'true'} {eps_page}
), att AS (
  SELECT a.endpoint_id,
         count(*) FILTER (WHERE a.attempted_at > now() - interval '1 hour') AS n_1h,
         count(*) FILTER (WHERE a.attempted_at > now() - interval '1 hour'
                          AND a.result = 'delivered') AS ok_1h,
         count(*) AS n_24h,
         count(*) FILTER (WHERE a.result = 'delivered') AS ok_24h,
         max(a.attempted_at) FILTER (WHERE a.result = 'delivered') AS last_ok,
         max(a.attempted_at) FILTER (WHERE a.result <> 'delivered') AS last_fail
    FROM delivery_attempts a
   WHERE a.attempted_at > now() - interval '24 hours'
     AND a.endpoint_id IN (SELECT endpoint_id FROM eps)
   GROUP BY a.endpoint_id
), brk AS (
  SELECT DISTINCT o.endpoint_id FROM delivery_outcomes o
   WHERE o.kind = 'quarantined' AND o.occurred_at > now() - make_interval(secs => %s)
     AND o.endpoint_id IN (SELECT endpoint_id FROM eps)
), dl AS (
  SELECT d.endpoint_id, count(*) AS backlog, count(*) FILTER (WHERE d.status = 'held') AS held
    FROM deliveries d
   WHERE d.status = ANY(%s) AND d.endpoint_id IN (SELECT endpoint_id FROM eps)
     AND {d_where}
   GROUP BY d.endpoint_id
){halt_cte}, rows AS (
  SELECT eps.endpoint_id, eps.app_id, eps.name, eps.enabled,
         CASE WHEN NOT eps.enabled THEN 'disabled'
              {halted}
              WHEN b.endpoint_id IS NOT NULL THEN 'quarantined'
              WHEN coalesce(att.n_1h, 0) >= %s
                   AND att.ok_1h::float8 / att.n_1h < %s THEN 'degraded'
              ELSE 'healthy' END AS state,
         coalesce(att.n_1h, 0) AS n_1h, coalesce(att.ok_1h, 0) AS ok_1h,
         coalesce(att.n_24h, 0) AS n_24h, coalesce(att.ok_24h, 0) AS ok_24h,
         att.last_ok, att.last_fail, b.endpoint_id IS NOT NULL AS breaker_open,
         coalesce(dl.backlog, 0) AS backlog, {held_col} AS held, {halt_col} AS halted
    FROM eps
    LEFT JOIN att ON att.endpoint_id = eps.endpoint_id
    LEFT JOIN brk b ON b.endpoint_id = eps.endpoint_id
    LEFT JOIN dl ON dl.endpoint_id = eps.endpoint_id{halt_join}
)
SELECT endpoint_id, app_id, name, enabled, state, n_1h, ok_1h, n_24h, ok_24h, last_ok,
       last_fail, breaker_open, backlog, held, halted
  FROM rows {state_where}
 ORDER BY endpoint_id
 LIMIT %s OFFSET %s"""
    args: list[Any] = [*ep_args]
    if state is None:
        args += [limit, offset]
    args += [breaker_open_s, list(_UNSETTLED), *d_args, DEGRADED_MIN_ATTEMPTS, DEGRADED_BELOW]
    if state is None:
        args += [limit, 0]  # eps holds the page already
    else:
        args += [state, limit, offset]
    return sql, args


def _rate(ok: int, n: int) -> float | None:
    return None if n == 0 else ok / n


def _row(r: tuple[Any, ...], p: Principal) -> dict[str, Any]:
    out: dict[str, Any] = {
        "endpoint_id": r[0], "app_id": r[1], "name": r[2], "enabled": r[3], "state": r[4],
        "success_rate": {"1h": _rate(r[6], r[5]), "24h": _rate(r[8], r[7])},
        "attempts": {"1h": r[5], "24h": r[7]},
        "last_success_at_ms": ms_of(r[9]), "last_failure_at_ms": ms_of(r[10]),
        "breaker": "open" if r[11] else "closed", "backlog": r[12],
    }
    if not p.is_publisher:
        out["held"] = r[13]
        out["halted"] = r[14]
    return out


def list_health(conn: psycopg.Connection[Any], p: Principal, hq: HealthQuery,
                breaker_open_s: float) -> tuple[list[dict[str, Any]], int | None]:
    """One page of endpoints in id order, and the offset of the next page (None on the
    last)."""
    sql, args = _sql(p, breaker_open_s, endpoint_id=None, app_id=hq.app_id, state=hq.state,
                     limit=hq.limit + 1, offset=hq.offset)
    rows = conn.execute(sql, args).fetchall()
    page = [_row(r, p) for r in rows[: hq.limit]]
    return page, (hq.offset + hq.limit if len(rows) > hq.limit else None)


def endpoint_health(conn: psycopg.Connection[Any], p: Principal, endpoint_id: str,
                    breaker_open_s: float) -> dict[str, Any]:
    """One endpoint's health. Raises :class:`~replay_console.queries.NotFound` when there
    is no such endpoint or ``p`` may not see it."""
    if not ID.match(endpoint_id):
        raise q.NotFound(f"no endpoint {endpoint_id[:80]!r}")
    sql, args = _sql(p, breaker_open_s, endpoint_id=endpoint_id, app_id=None, state=None,
                     limit=1, offset=0)
    row = conn.execute(sql, args).fetchone()
    if row is None:
        raise q.NotFound(f"no endpoint {endpoint_id!r}")
    return _row(row, p)


# --- routes -----------------------------------------------------------------------------

def _query(request: web.Request) -> tuple[dict[str, str], dict[str, int]]:
    multi = {k: len(request.query.getall(k)) for k in request.query}
    return {k: request.query[k] for k in request.query}, multi


def _list(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        params, multi = _query(request)
        hq = parse_health_query(p, params, multi)
        open_s = c.settings.breaker_open_s
        rows, nxt = await c.pool.run(lambda conn: list_health(conn, p, hq, open_s))
        f = hq.to_params()
        next_url = f"?{urlencode({**f, 'offset': nxt})}" if nxt is not None else None
        prev_url = None
        if hq.offset > 0:
            prev_url = f"?{urlencode({**f, 'offset': max(0, hq.offset - hq.limit)})}"
        data = {"endpoints": rows, "limit": hq.limit, "offset": hq.offset,
                "next_offset": nxt, "breaker_window_s": open_s}
        states = _PUBLISHER_STATES if p.is_publisher else STATES
        return c.reply(request, data, "endpoints.html", rows=rows, f=f, states=states,
                       next_url=next_url, prev_url=prev_url, breaker_window_s=open_s)
    return h


def _one(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        if request.query:
            raise Problem(400, "this endpoint takes no query parameters")
        eid = request.match_info["id"]
        open_s = c.settings.breaker_open_s
        row = await c.pool.run(lambda conn: endpoint_health(conn, p, eid, open_s))
        return web.json_response(row)
    return h


def add_health_routes(r: web.UrlDispatcher, c: Console) -> None:
    """``GET /endpoints`` (page), ``GET /api/v1/endpoints`` and
    ``GET /api/v1/endpoints/{id}/health`` (JSON)."""
    r.add_get("/endpoints", _list(c))
    r.add_get("/api/v1/endpoints", _list(c))
    r.add_get("/api/v1/endpoints/{id}/health", _one(c))
