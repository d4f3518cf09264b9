"""The console's read handlers (pages and the API share them): deliveries and a delivery,
an endpoint, held deliveries, dead letters, suppressions, the audit log, a replay job and
a bulk replay's preview. Each reads through :mod:`.queries` (scoped by the principal) on
the connection pool; the state-changing handlers are in :mod:`.writes`."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import urlencode

import psycopg
from aiohttp import web

from replay_console import actions as act
from replay_console import queries as q
from replay_console.auth import may
from replay_console.filters import ID, MAX_PAGE
from replay_console.forms import filter_from
from replay_console.http import Console, Handler, me, not_for_publishers, staff
from replay_console.problem import Problem
from replay_console.throttle import Throttled

__all__ = ["HELD_PAGE_LIMIT", "audit", "audit_filter", "dead_letters", "deliveries",
           "delivery", "endpoint", "held", "import_page", "job", "preview", "rerender",
           "suppressions"]


def deliveries(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        statuses = q.PUBLISHER_STATUSES if p.is_publisher else q.STATUSES
        flt = q.parse_filter(dict(request.query), statuses)
        rows, nxt = await c.pool.run(lambda conn: q.list_deliveries(conn, p, flt))
        params = flt.to_params()
        if flt.limit != 50:
            params["limit"] = str(flt.limit)
        next_url = f"?{urlencode({**params, 'cursor': nxt})}" if nxt else None
        data = {"deliveries": rows, "next_cursor": nxt}
        return c.reply(request, data, "deliveries.html", rows=rows, next_url=next_url,
                       f=params, statuses=statuses, query=urlencode(params))
    return h


def delivery(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        did = request.match_info["id"]
        d = await c.pool.run(lambda conn: q.delivery_detail(conn, p, did))
        return c.reply(request, d, "delivery.html", d=d, diff=None, edit={})
    return h


def endpoint(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        eid = request.match_info["id"]
        e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
        return c.reply(request, e, "endpoint.html", e=e, problems=[], sent=None)
    return h


# The held page lists at most this many cohorts and deliveries, the oldest holds first,
# and says so when it leaves some out (filters narrow it).
HELD_PAGE_LIMIT = 500


def held(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        not_for_publishers(request)
        from postbacks.db.anomaly import held_cohorts, held_deliveries

        flt = {k: request.query.get(k) or None for k in ("endpoint", "reason", "app")}
        for k, v in flt.items():
            if v is not None and not ID.match(v):
                raise Problem(400, f"{k} {v[:60]!r} is not a valid id")
        n = HELD_PAGE_LIMIT

        def read(conn: psycopg.Connection[Any]) -> tuple[list[Any], list[dict[str, Any]]]:
            # one more than shown of each: whether the page leaves some out
            return (held_deliveries(conn, endpoint_id=flt["endpoint"], reason=flt["reason"],
                                    app_id=flt["app"], limit=n + 1),
                    held_cohorts(conn, endpoint_id=flt["endpoint"], reason=flt["reason"],
                                 app_id=flt["app"], limit=n + 1))
        held, cohorts = await c.pool.run(read)
        rows = [{"delivery_id": x.delivery_id, "endpoint_id": x.endpoint_id,
                 "app_id": x.app_id, "hold_reason": x.hold_reason, "held_at_ms": x.held_at_ms,
                 "payout_usd_micros": x.payout_usd_micros, "idempotency_key": x.idempotency_key}
                for x in held[:n]]
        more = {"held": len(held) > n, "cohorts": len(cohorts) > n}
        data = {"held": rows, "cohorts": cohorts[:n], "more": more}
        return c.reply(request, data, "held.html", rows=rows, cohorts=cohorts[:n], more=more,
                       limit=n, f={k: v for k, v in flt.items() if v})
    return h


def dead_letters(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = staff(request, "dead letters are")
        flt = q.parse_dead_letter_filter(dict(request.query))
        page = await c.pool.run(lambda conn: q.dead_letters(conn, p, flt))
        params = flt.to_params()
        if flt.limit != 100:
            params["limit"] = str(flt.limit)
        links: dict[str, str | None] = {"next": None, "previous": None}
        if flt.offset + flt.limit < page["total"]:
            links["next"] = f"?{urlencode({**params, 'offset': flt.offset + flt.limit})}"
        if flt.offset > 0:
            back = max(0, flt.offset - flt.limit)
            links["previous"] = f"?{urlencode({**params, 'offset': back})}"
        data = {**page, "offset": flt.offset, "limit": flt.limit, **links}
        return c.reply(request, data, "dead_letters.html", rows=page["dead_letters"],
                       unresolved=flt.unresolved, dl=data, f=flt.to_params())
    return h


def suppressions(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = staff(request, "suppressions are")
        rows = await c.pool.run(lambda conn: q.suppressions(conn, p))
        return c.reply(request, {"suppressions": rows}, "suppressions.html", rows=rows)
    return h


_AUDIT_PARAMS = {"actor", "action", "target", "target_type", "target_id", "limit"}
_AUDIT_ACTION = re.compile(r"[a-z_]{1,40}(\.[a-z_]{1,40}){0,3}", re.ASCII)
_AUDIT_TARGET_TYPE = re.compile(r"[a-z_]{1,40}", re.ASCII)


def audit_filter(query: Any) -> tuple[dict[str, str], int]:
    """The audit page's filters (actor, action, target type, target id) and limit; a 400
    names a bad one."""
    unknown = sorted(set(query) - _AUDIT_PARAMS)
    if unknown:
        raise Problem(400, f"unknown audit filter(s): {', '.join(unknown)} "
                      f"(use {', '.join(sorted(_AUDIT_PARAMS))})")
    f = {k: v.strip() for k in sorted(_AUDIT_PARAMS - {"limit"})
         if (v := query.get(k, "")).strip()}
    if "target" in f and "target_id" in f and f["target"] != f["target_id"]:
        raise Problem(400, "give the target id once (target or target_id)")
    if "target_id" in f:
        f["target"] = f.pop("target_id")
    if "actor" in f and len(f["actor"]) > 200:
        raise Problem(400, "actor is longer than 200 characters")
    if "action" in f and not _AUDIT_ACTION.fullmatch(f["action"]):
        raise Problem(400, "action must look like held.release or delivery.replay")
    if "target_type" in f and not _AUDIT_TARGET_TYPE.fullmatch(f["target_type"]):
        raise Problem(400, "target_type must look like delivery or endpoint")
    if "target" in f and not ID.match(f["target"]):
        raise Problem(400, "target is not a valid id")
    raw = query.get("limit", "").strip()
    limit = 100
    if raw:
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PAGE:
            raise Problem(400, f"limit must be a whole number from 1 to {MAX_PAGE}")
        limit = int(raw)
    return f, limit


def audit(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        staff(request, "the audit log is")
        f, limit = audit_filter(request.query)
        rows = await c.pool.run(lambda conn: q.audit_rows(
            conn, target_type=f.get("target_type"), target_id=f.get("target"),
            actor=f.get("actor"), action=f.get("action"), limit=limit))
        return c.reply(request, {"audit": rows}, "audit.html", rows=rows, f=f, limit=limit)
    return h


def job(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        if not may(p, "replay"):
            raise Problem(403, f"a {p.role} may not see replay jobs")
        job = request.match_info["job"]
        status = await c.pool.run(lambda conn: act.job_status(conn, job))
        return c.reply(request, status, "replay_job.html", job=status)
    return h


def preview(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        if not may(p, "replay"):  # before the filter: its errors name internal statuses
            raise Problem(403, f"a {p.role} may not replay deliveries")
        flt = filter_from(dict(request.query))
        pv = await c.pool.run(lambda conn: act.replay_preview(conn, p, flt, c.settings))
        return c.reply(request, pv, "replay_preview.html", pv=pv, f=flt.to_params())
    return h


def rerender(c: Console) -> Handler:
    """A re-render's preview: the endpoint's undelivered deliveries rendered now."""
    async def h(request: web.Request) -> web.StreamResponse:
        from replay_console.rerender import judge_rows, preview_rows

        p = staff(request, "re-renders are")
        if not may(p, "replay"):
            raise Problem(403, f"a {p.role} may not replay deliveries")
        eid = request.match_info["id"]
        # Rendering every undelivered delivery of an endpoint (up to the bulk cap) takes
        # seconds: one preview per person at a time, a few per console, and rendered off
        # the database connection, so the rest of the console keeps answering.
        if p.actor in c.previewing:
            raise Throttled(2, "a re-render preview of yours is still running")
        c.previewing.add(p.actor)
        acquired = False
        work: asyncio.Future[Any] | None = None
        try:
            await c.previews.acquire()
            acquired = True
            ep, rows = await c.pool.run(lambda conn: preview_rows(conn, c.settings, p, eid))
            work = asyncio.ensure_future(asyncio.to_thread(judge_rows, c.settings, p, ep, rows))
            pv = await asyncio.shield(work)
        finally:
            def free(_: object = None) -> None:
                if acquired:
                    c.previews.release()
                c.previewing.discard(p.actor)

            if work is not None and not work.done():  # cancelled: free when it ends
                work.add_done_callback(free)
            else:
                free()
        return c.reply(request, pv, "rerender.html", pv=pv)
    return h


def import_page(c: Console) -> Handler:
    """The backfill import form (the report comes back from ``POST /import``)."""
    async def h(request: web.Request) -> web.StreamResponse:
        p = staff(request, "imports are")
        if not may(p, "import"):
            raise Problem(403, f"a {p.role} may not import deliveries (reviewers and admins "
                          "may)")
        return c.render(request, "import.html", report=None, data="", fmt="auto")
    return h

