"""The replay console's web server: server-rendered pages and a JSON API on one aiohttp app.

Pages (``/deliveries``, ``/deliveries/{id}``, ``/endpoints/{id}``, ``/held``,
``/dead-letters``, ``/suppressions``, ``/audit``, ``/replays/{job}``) and the API
(``/api/v1/...``, same paths) call the same queries (:mod:`.queries`) and actions
(:mod:`.actions`). This module holds the routes, the middleware and sign-in; the read
handlers are in :mod:`.reads`, the state-changing ones in :mod:`.writes`, the plumbing
they share in :mod:`.http`. PostgreSQL work runs on a small pool of connections in threads, so a
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
import threading
import time
from importlib import resources
from typing import Any

import psycopg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from postbacks.core.override import OverrideError
from postbacks.errors import ServiceUnavailable
from postbacks.metrics import CONSOLE_REQUESTS
from postbacks.settings import Settings
from replay_console import queries as q
from replay_console import reads as rd
from replay_console import writes as w
from replay_console.auth import (
    Principal,
    check_csrf,
    end_session,
    lookup_token,
    session_cookie,
    session_token_id,
)
from replay_console.forms import MAX_BODY, body_of, text
from replay_console.guard import check_request, session_cookie_in
from replay_console.health import add_health_routes
from replay_console.http import (
    ACTION,
    COOKIE,
    COOKIE_VALUE,
    LOCAL_PATH,
    PRINCIPAL,
    REFUSED,
    Console,
    Handler,
    counted,
    problem,
    redirect,
)
from replay_console.pool import ConnPool
from replay_console.problem import Problem
from replay_console.rules import ActionError, Lookup, audit
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
    r.add_post("/logout", _logout(c))
    r.add_get("/", _home)
    for prefix in ("", "/api/v1"):
        r.add_get(f"{prefix}/deliveries", rd.deliveries(c))
        r.add_get(f"{prefix}/deliveries/{{id}}", rd.delivery(c))
        r.add_post(f"{prefix}/deliveries/{{id}}/replay", w.replay_one(c))
        r.add_post(f"{prefix}/deliveries/{{id}}/suppress", w.suppress(c))
        r.add_get(f"{prefix}/replays/preview", rd.preview(c))
        r.add_post(f"{prefix}/replays", w.replay_bulk(c))
        r.add_get(f"{prefix}/replays/{{job}}", rd.job(c))
        r.add_post(f"{prefix}/endpoints", w.endpoint_create(c))
        r.add_get(f"{prefix}/endpoints/{{id}}", rd.endpoint(c))
        r.add_post(f"{prefix}/endpoints/{{id}}", w.endpoint_save(c))
        r.add_post(f"{prefix}/endpoints/{{id}}/secrets", w.rotate(c))
        r.add_post(f"{prefix}/endpoints/{{id}}/test-send", w.send_test(c))
        r.add_get(f"{prefix}/endpoints/{{id}}/rerender", rd.rerender(c))
        r.add_post(f"{prefix}/endpoints/{{id}}/rerender", w.rerender(c))
        r.add_get(f"{prefix}/held", rd.held(c))
        r.add_post(f"{prefix}/held/release", w.resolve(c, "released"))
        r.add_post(f"{prefix}/held/reject", w.resolve(c, "rejected"))
        r.add_get(f"{prefix}/dead-letters", rd.dead_letters(c))
        r.add_post(f"{prefix}/dead-letters/{{id}}/resolve", w.resolve_dl(c))
        r.add_get(f"{prefix}/suppressions", rd.suppressions(c))
        r.add_post(f"{prefix}/suppressions/{{id}}/resolve", w.resolve_suppression(c))
        r.add_get(f"{prefix}/audit", rd.audit(c))
        r.add_post(f"{prefix}/import", w.import_backfill(c))
    r.add_get("/import", rd.import_page(c))
    add_health_routes(r, c)
    app.on_cleanup.append(lambda _a: asyncio.to_thread(c.pool.close))
    app.on_cleanup.append(lambda _a: asyncio.to_thread(c.auth_pool.close))
    return app


_PUBLIC = {"/healthz", "/metrics", "/login"}
# Requests one actor may have running at once: the database pool is a few connections
# shared by everyone, and a slow search holds one until its statement timeout.
IN_FLIGHT_PER_ACTOR = 2
_PUBLIC_PREFIX = "/static/"


def _route(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


def _bearer(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth.startswith("Bearer ") else None


async def _audit_refusal(c: Console, refusals: RefusalAudit, request: web.Request,
                         status: int, reason: str, marked: bool = False) -> None:
    p = request.get(PRINCIPAL)
    actor = p.actor if p is not None else \
        f"anonymous:{client_address(request, c.trusted_proxies)}"
    await refusals.record(c.pool.run, actor, route_action(request, request.get(ACTION)),
                          request.path, status, reason, marked=marked)


def _middleware(c: Console, throttle: SignInThrottle, refusals: RefusalAudit) -> Any:
    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        status = 500
        reason = ""
        audit = False
        busy: str | None = None  # the actor counted in c.in_flight for this request
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
                    # a cookie this console signed whose session has ended: a copy of a
                    # signed-out or revoked user's cookie in use is worth an audit row
                    ended = None if bearer else session_token_id(
                        c.key, session_cookie_in(request) or "")
                    raise Problem(401, "sign in first (a console token)" if ended is None
                                  else f"the session of token {ended} has ended (signed "
                                  "out, or the token revoked or expired): sign in again",
                                  audit=ended is not None)
                request[PRINCIPAL] = p
                busy = p.actor
                if c.in_flight.get(busy, 0) >= IN_FLIGHT_PER_ACTOR:
                    busy = None
                    raise Throttled(1, f"{IN_FLIGHT_PER_ACTOR} requests of yours are still "
                                       "running (a slow search holds a database connection"
                                       " until it ends): wait for them")
                c.in_flight[busy] = c.in_flight.get(busy, 0) + 1
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
            refused = request.get(REFUSED)
            if refused is not None:
                audit, reason = True, refused
            return resp
        except Throttled as exc:
            status, reason = 429, str(exc)
            resp = problem(c, request, 429, reason, {"retry_after_s": exc.retry_after_s})
            resp.headers["Retry-After"] = str(exc.retry_after_s)
            return resp
        except (Problem, ActionError) as exc:
            status, reason, audit = exc.status, str(exc), exc.audit
            return problem(c, request, exc.status, str(exc), exc.extra)
        except (q.FilterError, OverrideError) as exc:
            status = 400
            return problem(c, request, 400, str(exc), {})
        except q.NotFound as exc:
            status = 404
            return problem(c, request, 404, str(exc), {})
        except ServiceUnavailable as exc:  # its text names hosts and users: the log's
            status = 503
            log.warning("console: a service is unavailable: %s", exc)
            return problem(c, request, 503, "a service the console needs (PostgreSQL or "
                           "Kafka) is unavailable; try again", {})
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            status = 503
            log.warning("console: database read only: %s", exc)
            return problem(c, request, 503, "the database takes no changes now (read only);"
                           " try again later", {})
        except psycopg.errors.QueryCanceled as exc:
            status = 503
            log.warning("console: %s %s: a query ran over its time: %s", request.method,
                        request.path, exc)
            return problem(c, request, 503, f"the query ran over "
                           f"{c.pool.statement_timeout_ms / 1000:g} s and was cancelled: narrow"
                           " it (a shorter time range, one app or endpoint) and try again; a"
                           " replay may also have waited that long behind another one", {})
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
            if busy is not None:
                left = c.in_flight.get(busy, 1) - 1
                if left > 0:
                    c.in_flight[busy] = left
                else:
                    c.in_flight.pop(busy, None)
            CONSOLE_REQUESTS.labels(_route(request), f"{status // 100}xx").observe(
                time.perf_counter() - start)
            if status in (403, 429) or audit:
                await _audit_refusal(c, refusals, request, status, reason, marked=audit)

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
        signed_in = p
        await c.pool.run(lambda conn: audit(conn, signed_in, "console.login", "console_token",
                                            signed_in.token_id, None, None))
        resp = redirect(nxt)
        resp.set_cookie(COOKIE, session_cookie(c.key, p.token_id), httponly=True,
                        samesite="Strict", path="/", max_age=8 * 3600,
                        secure=c.is_tls(request))
        return resp
    return h


def _logout(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        cookie: str | None = request.get(COOKIE_VALUE)
        who: Principal | None = request.get(PRINCIPAL)

        def end(conn: psycopg.Connection[Any]) -> None:
            if end_session(conn, c.key, str(cookie)) and who is not None:
                audit(conn, who, "console.logout", "console_token", who.token_id, None, None)

        if cookie is not None:  # ended on the server too: a copy of the cookie is refused
            await c.pool.run(end)
        resp = redirect("/login")
        resp.del_cookie(COOKIE, path="/")
        return resp
    return h


# --- reads ------------------------------------------------------------------------------

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
