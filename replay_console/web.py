"""The replay console's web server: server-rendered pages and a JSON API on one aiohttp app.

Pages (``/deliveries``, ``/deliveries/{id}``, ``/endpoints/{id}``, ``/held``,
``/dead-letters``, ``/suppressions``, ``/audit``, ``/replays/{job}``) and the API
(``/api/v1/...``, same paths) call the same queries (:mod:`.queries`) and actions
(:mod:`.actions`). This module holds the routes, the middleware, sign-in and the read
handlers; the state-changing handlers are in :mod:`.writes`, the plumbing both share in
:mod:`.http`. PostgreSQL work runs on a small pool of connections in threads, so a
slow query never blocks the event loop. Pages are plain HTML (no build step, no script
needed to use them; the one stylesheet is ``/static/console.css``). Every response is timed
in ``postbacks_console_request_seconds``; ``/metrics``, ``/healthz`` and ``/static/`` are
public.

Every request's path, query, credential headers and cookie pass :mod:`.guard` before
sign-in, and every body value when it is parsed: bad bytes get a 4xx, never a 5xx. Every
response carries a strict Content-Security-Policy (no script, no inline style), DENY
framing, nosniff and no-referrer; HSTS when the browser came over TLS
(:meth:`.Console.is_tls`, which also decides the cookie's Secure flag). An HTML request
that fails gets a page with the status, the reason and a link back.

Sign-in: ``POST /login`` with a token sets the session cookie (HttpOnly, SameSite=Strict);
the API also takes ``Authorization: Bearer <token>``. Every state-changing request made
with the cookie must carry the CSRF token (form field ``csrf`` or header
``X-CSRF-Token``); the pages embed it in every form. Failed sign-ins (form or bearer) are
throttled per client address and per token prefix, and every 403 and 429 is audited,
bounded (:mod:`.throttle`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import psycopg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from postbacks.core.override import OverrideError
from postbacks.errors import ServiceUnavailable
from postbacks.metrics import CONSOLE_REQUESTS
from postbacks.settings import Settings
from replay_console import actions as act
from replay_console import queries as q
from replay_console import writes as w
from replay_console.auth import check_csrf, lookup_token, may, session_cookie
from replay_console.filters import ID, MAX_PAGE
from replay_console.forms import MAX_BODY, body_of, filter_from, text
from replay_console.guard import check_request
from replay_console.health import add_health_routes
from replay_console.http import (
    ACTION,
    COOKIE,
    COOKIE_VALUE,
    LOCAL_PATH,
    PRINCIPAL,
    Console,
    Handler,
    counted,
    me,
    not_for_publishers,
    problem,
    redirect,
    staff,
)
from replay_console.pool import ConnPool
from replay_console.problem import Problem
from replay_console.rules import ActionError, Lookup
from replay_console.throttle import (
    RefusalAudit,
    SignInThrottle,
    Throttled,
    client_address,
    route_action,
)

__all__ = ["make_app", "serve"]

log = logging.getLogger("postbacks.console")


def make_app(settings: Settings, *, lookup: Lookup | None = None,
             pool: ConnPool | None = None) -> web.Application:
    """The console app. ``lookup`` is the DNS seam of the SSRF check (tests)."""
    c = Console(settings, pool or ConnPool(settings.database_url), lookup)
    throttle = SignInThrottle()  # this instance's own counts
    app = web.Application(middlewares=[_middleware(c, throttle, RefusalAudit())],
                          client_max_size=MAX_BODY)

    async def secure_headers(request: web.Request, response: web.StreamResponse) -> None:
        c.secure_headers(request, response)

    app.on_response_prepare.append(secure_headers)
    r = app.router
    r.add_static("/static", str(resources.files("replay_console") / "static"),
                 append_version=False)
    r.add_get("/healthz", _healthz)
    r.add_get("/metrics", _metrics)
    r.add_get("/login", _login_page(c))
    r.add_post("/login", _login(c, throttle))
    r.add_post("/logout", _logout)
    r.add_get("/", _home)
    for prefix in ("", "/api/v1"):
        r.add_get(f"{prefix}/deliveries", _list(c))
        r.add_get(f"{prefix}/deliveries/{{id}}", _detail(c))
        r.add_post(f"{prefix}/deliveries/{{id}}/replay", w.replay_one(c))
        r.add_post(f"{prefix}/deliveries/{{id}}/suppress", w.suppress(c))
        r.add_get(f"{prefix}/replays/preview", _preview(c))
        r.add_post(f"{prefix}/replays", w.replay_bulk(c))
        r.add_get(f"{prefix}/replays/{{job}}", _job(c))
        r.add_post(f"{prefix}/endpoints", w.endpoint_create(c))
        r.add_get(f"{prefix}/endpoints/{{id}}", _endpoint(c))
        r.add_post(f"{prefix}/endpoints/{{id}}", w.endpoint_save(c))
        r.add_post(f"{prefix}/endpoints/{{id}}/secrets", w.rotate(c))
        r.add_post(f"{prefix}/endpoints/{{id}}/test-send", w.send_test(c))
        r.add_get(f"{prefix}/held", _held(c))
        r.add_post(f"{prefix}/held/release", w.resolve(c, "released"))
        r.add_post(f"{prefix}/held/reject", w.resolve(c, "rejected"))
        r.add_get(f"{prefix}/dead-letters", _dead_letters(c))
        r.add_post(f"{prefix}/dead-letters/{{id}}/resolve", w.resolve_dl(c))
        r.add_get(f"{prefix}/suppressions", _suppressions(c))
        r.add_get(f"{prefix}/audit", _audit(c))
    add_health_routes(r, c)
    app.on_cleanup.append(lambda _a: asyncio.to_thread(c.pool.close))
    return app


_PUBLIC = {"/healthz", "/metrics", "/login"}
_PUBLIC_PREFIX = "/static/"


def _route(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth.startswith("Bearer ") else None


async def _audit_refusal(c: Console, refusals: RefusalAudit, request: web.Request,
                         status: int, reason: str) -> None:
    p = request.get(PRINCIPAL)
    actor = p.actor if p is not None else \
        f"anonymous:{client_address(request, c.trusted_proxies)}"
    action = route_action(request, request.get(ACTION))
    if not refusals.admit(actor, action):
        return
    try:
        await c.pool.run(lambda conn: refusals.write(conn, actor, action, request.path,
                                                     status, reason))
    except Exception:  # the refusal stands; its audit row is best effort
        log.exception("console: could not audit a refused request")


def _middleware(c: Console, throttle: SignInThrottle, refusals: RefusalAudit) -> Any:
    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        status = 500
        reason = ""
        try:
            check_request(request)  # every path segment, parameter, header and cookie
            if request.path not in _PUBLIC and not request.path.startswith(_PUBLIC_PREFIX):
                bearer = _bearer(request)
                keys = () if bearer is None else throttle.keys(
                    client_address(request, c.trusted_proxies), bearer)
                throttle.check(keys)
                p, cookie = await c.principal(request)
                if p is None:
                    throttle.failed(keys)
                    raise Problem(401, "sign in first (a console token)")
                request[PRINCIPAL] = p
                if cookie is not None:
                    request[COOKIE_VALUE] = cookie
                if request.method not in ("GET", "HEAD") and cookie is not None:
                    given = request.headers.get("X-CSRF-Token")
                    if given is None and request.content_type != "application/json":
                        v = (await body_of(request)).get("csrf")
                        given = v if isinstance(v, str) else None
                    if not check_csrf(c.key, cookie, given):
                        raise Problem(403, "missing or wrong CSRF token: reload the page and "
                                      "try again")
            resp = await handler(request)
            status = resp.status
            return resp
        except Throttled as exc:
            status, reason = 429, str(exc)
            resp = problem(c, request, 429, reason, {"retry_after_s": exc.retry_after_s})
            resp.headers["Retry-After"] = str(exc.retry_after_s)
            return resp
        except Problem as exc:
            status, reason = exc.status, str(exc)
            return problem(c, request, exc.status, str(exc), exc.extra)
        except ActionError as exc:
            status, reason = exc.status, str(exc)
            return problem(c, request, exc.status, str(exc), exc.extra)
        except (q.FilterError, OverrideError) as exc:
            status = 400
            return problem(c, request, 400, str(exc), {})
        except q.NotFound as exc:
            status = 404
            return problem(c, request, 404, str(exc), {})
        except ServiceUnavailable as exc:
            status = 503
            return problem(c, request, 503, str(exc), {})
        except psycopg.OperationalError as exc:
            status = 503
            log.warning("console: database unavailable: %s", exc)
            return problem(c, request, 503, "the database is unavailable; try again", {})
        except web.HTTPException as exc:
            status = exc.status
            if status < 400:
                raise
            # the router's 404/405, the body limit's 413: the same answer as any error
            resp = problem(c, request, status, _http_error_text(exc), {})
            if "Allow" in exc.headers:
                resp.headers["Allow"] = exc.headers["Allow"]
            return resp
        except Exception:
            log.exception("console: %s %s failed", request.method, request.path)
            status = 500
            return problem(c, request, 500, "internal error (logged)", {})
        finally:
            CONSOLE_REQUESTS.labels(_route(request), f"{status // 100}xx").observe(
                time.perf_counter() - start)
            if status in (403, 429):
                await _audit_refusal(c, refusals, request, status, reason)

    return mw


def _http_error_text(exc: web.HTTPException) -> str:
    if exc.status == 404:
        return "no such page"
    if exc.status == 405:
        return "this page does not take that method"
    if exc.status == 413:
        return f"request body larger than {MAX_BODY} bytes"
    return exc.reason


async def _home(_request: web.Request) -> web.StreamResponse:
    return redirect("/deliveries")


async def _healthz(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _metrics(_request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _login_page(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        return c.render(request, "login.html", error=None,
                        next=request.query.get("next", "/deliveries"))
    return h


def _login(c: Console, throttle: SignInThrottle) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        body = await body_of(request)
        token = text(body, "token") or ""
        nxt = text(body, "next") or "/deliveries"
        if not LOCAL_PATH.fullmatch(nxt):
            nxt = "/deliveries"
        site = request.headers.get("Sec-Fetch-Site")
        origin = request.headers.get("Origin")
        # Under Referrer-Policy: no-referrer a browser posts the console's own form with
        # "Origin: null"; its Sec-Fetch-Site (which no page can set) then says same-origin.
        if origin == "null" and site == "same-origin":
            origin = None
        if site == "cross-site" or (origin and origin != c.origin(request)):
            counted("login", "refused")
            raise Problem(403, "sign in from the console's own page")
        keys = throttle.keys(client_address(request, c.trusted_proxies), token)
        try:
            throttle.check(keys)  # before the lookup: a right token is refused too
        except Throttled:
            counted("login", "refused")
            raise
        p = await c.pool.run(lambda conn: lookup_token(conn, token)) if token else None
        if p is None:
            counted("login", "refused")
            if token:
                throttle.failed(keys)
            return c.render(request, "login.html", status=401,
                            error="unknown, expired or revoked token", next=nxt)
        counted("login", "ok")
        resp = redirect(nxt)
        resp.set_cookie(COOKIE, session_cookie(c.key, p.token_id), httponly=True,
                        samesite="Strict", path="/", max_age=8 * 3600,
                        secure=c.is_tls(request))
        return resp
    return h


async def _logout(_request: web.Request) -> web.StreamResponse:
    resp = redirect("/login")
    resp.del_cookie(COOKIE, path="/")
    return resp


# --- reads ------------------------------------------------------------------------------

def _list(c: Console) -> Handler:
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


def _detail(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        did = request.match_info["id"]
        d = await c.pool.run(lambda conn: q.delivery_detail(conn, p, did))
        return c.reply(request, d, "delivery.html", d=d, diff=None, edit={})
    return h


def _endpoint(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        eid = request.match_info["id"]
        e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
        return c.reply(request, e, "endpoint.html", e=e, problems=[], sent=None)
    return h


# The held page lists at most this many cohorts and deliveries, the oldest holds first,
# and says so when it leaves some out (filters narrow it).
HELD_PAGE_LIMIT = 500


def _held(c: Console) -> Handler:
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


def _dead_letters(c: Console) -> Handler:
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


def _suppressions(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = staff(request, "suppressions are")
        rows = await c.pool.run(lambda conn: q.suppressions(conn, p))
        return c.reply(request, {"suppressions": rows}, "suppressions.html", rows=rows)
    return h


_AUDIT_PARAMS = {"actor", "action", "target", "target_type", "target_id", "limit"}
_AUDIT_ACTION = re.compile(r"[a-z_]{1,40}(\.[a-z_]{1,40}){0,3}", re.ASCII)
_AUDIT_TARGET_TYPE = re.compile(r"[a-z_]{1,40}", re.ASCII)


def _audit_filter(query: Any) -> tuple[dict[str, str], int]:
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


def _audit(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        staff(request, "the audit log is")
        f, limit = _audit_filter(request.query)
        rows = await c.pool.run(lambda conn: q.audit_rows(
            conn, target_type=f.get("target_type"), target_id=f.get("target"),
            actor=f.get("actor"), action=f.get("action"), limit=limit))
        return c.reply(request, {"audit": rows}, "audit.html", rows=rows, f=f, limit=limit)
    return h


def _job(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        if not may(p, "replay"):
            raise Problem(403, f"a {p.role} may not see replay jobs")
        job = request.match_info["job"]
        status = await c.pool.run(lambda conn: act.job_status(conn, job))
        return c.reply(request, status, "replay_job.html", job=status)
    return h


def _preview(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        if not may(p, "replay"):  # before the filter: its errors name internal statuses
            raise Problem(403, f"a {p.role} may not replay deliveries")
        flt = filter_from(dict(request.query))
        pv = await c.pool.run(lambda conn: act.replay_preview(conn, p, flt, c.settings))
        return c.reply(request, pv, "replay_preview.html", pv=pv, f=flt.to_params())
    return h


# --- serve ------------------------------------------------------------------------------

def serve(settings: Settings, *, host: str | None = None, port: int | None = None,
          drain: bool = True) -> None:
    """Run the console (and the replay drainer, in a thread) until SIGINT/SIGTERM."""
    from replay_console.drain import run_drainer

    stop = threading.Event()
    drainer = None
    if drain:
        drainer = threading.Thread(target=run_drainer, args=(settings, stop),
                                   name="replay-drainer", daemon=True)
        drainer.start()
    h = host or settings.console_host
    pt = settings.console_port if port is None else port
    print(f"console on http://{h}:{pt}/ (sign in with a token: postbacks console token "
          f"create)", flush=True)
    try:
        web.run_app(make_app(settings), host=h, port=pt, print=None,
                    access_log=None, handle_signals=True)
    finally:
        stop.set()
        if drainer is not None:
            drainer.join(timeout=5)
