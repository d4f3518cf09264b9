"""The replay console's web server: server-rendered pages and a JSON API on one aiohttp app.

Pages (``/deliveries``, ``/deliveries/{id}``, ``/endpoints/{id}``, ``/held``,
``/dead-letters``, ``/suppressions``, ``/audit``, ``/replays/{job}``) and the API
(``/api/v1/...``, same paths) call the same queries (:mod:`.queries`) and actions
(:mod:`.actions`); PostgreSQL work runs on a small pool of connections in threads, so a
slow query never blocks the event loop. Pages are plain HTML (no build step, no script
needed to use them). Every response is timed in ``postbacks_console_request_seconds``;
``/metrics`` and ``/healthz`` are public.

Sign-in: ``POST /login`` with a token sets the session cookie (HttpOnly, SameSite=Strict);
the API also takes ``Authorization: Bearer <token>``. Every state-changing request made
with the cookie must carry the CSRF token (form field ``csrf`` or header
``X-CSRF-Token``); the pages embed it in every form.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
import psycopg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from postbacks.console import actions as act
from postbacks.console import endpoints as eps
from postbacks.console import queries as q
from postbacks.console.auth import (
    Principal,
    check_csrf,
    csrf_for,
    lookup_session,
    lookup_token,
    may,
    session_cookie,
)
from postbacks.console.forms import (
    MAX_BODY,
    Problem,
    body_of,
    filter_from,
    flag,
    id_list,
    is_api,
    override_from,
    text,
    whole,
)
from postbacks.console.pool import ConnPool
from postbacks.console.rules import ActionError, Lookup
from postbacks.core.override import OverrideError
from postbacks.errors import ServiceUnavailable
from postbacks.metrics import CONSOLE_ACTIONS, CONSOLE_REQUESTS
from postbacks.settings import Settings
from postbacks.tools.cli_output import usd

__all__ = ["make_app", "serve"]

log = logging.getLogger("postbacks.console")
PRINCIPAL = web.RequestKey("principal", Principal)
COOKIE_VALUE = web.RequestKey("cookie", str)
ACTION = web.RequestKey("action", str)  # the action a POST performs (metrics)
COOKIE = "pb_session"


# --- helpers ----------------------------------------------------------------------------

def _when(ms: int | None) -> str:
    if ms is None:
        return "—"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _jsonpretty(v: Any) -> str:
    return json.dumps(v, indent=2, sort_keys=True, default=str)


def _env() -> jinja2.Environment:
    folder = resources.files("postbacks") / "console" / "templates"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters.update(when=_when, usd=usd, pretty=_jsonpretty)
    return env


# --- the app ----------------------------------------------------------------------------

class Console:
    def __init__(self, settings: Settings, pool: ConnPool, lookup: Lookup | None) -> None:
        self.settings = settings
        self.pool = pool
        self.lookup = lookup
        # Never derived from a key with a public development default: a configured key, or
        # a random one for this process.
        configured = settings.console_session_key.reveal()
        self.key = (hashlib.sha256(b"postbacks-console-session|" + configured.encode()).digest()
                    if configured else secrets.token_bytes(32))
        self.env = _env()

    # auth ---------------------------------------------------------------------------

    async def principal(self, request: web.Request) -> tuple[Principal | None, str | None]:
        """The principal and, when signed in by cookie, the cookie (for CSRF)."""
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            token = auth[7:].strip()
            return await self.pool.run(lambda c: lookup_token(c, token)), None
        cookie = request.cookies.get(COOKIE)
        if cookie:
            p = await self.pool.run(lambda c: lookup_session(c, self.key, cookie))
            return p, cookie if p else None
        return None, None

    def render(self, request: web.Request, name: str, status: int = 200,
               **ctx: Any) -> web.Response:
        p: Principal | None = request.get(PRINCIPAL)
        cookie: str | None = request.get(COOKIE_VALUE)
        html = self.env.get_template(name).render(
            me=p, csrf=csrf_for(self.key, cookie) if cookie else "", may=may,
            path=request.path, **ctx)
        return web.Response(text=html, content_type="text/html", status=status,
                            headers={"Cache-Control": "no-store"})

    def reply(self, request: web.Request, data: Any, page: str | None = None,
              status: int = 200, **ctx: Any) -> web.StreamResponse:
        if is_api(request) or page is None:
            return web.json_response(data, status=status, dumps=lambda v: json.dumps(
                v, default=str))
        return self.render(request, page, status=status, data=data, **ctx)


def make_app(settings: Settings, *, lookup: Lookup | None = None,
             pool: ConnPool | None = None) -> web.Application:
    """The console app. ``lookup`` is the DNS seam of the SSRF check (tests)."""
    c = Console(settings, pool or ConnPool(settings.database_url), lookup)
    app = web.Application(middlewares=[_middleware(c)], client_max_size=MAX_BODY)
    r = app.router
    r.add_get("/healthz", _healthz)
    r.add_get("/metrics", _metrics)
    r.add_get("/login", _login_page(c))
    r.add_post("/login", _login(c))
    r.add_post("/logout", _logout)
    r.add_get("/", _home)
    for prefix in ("", "/api/v1"):
        r.add_get(f"{prefix}/deliveries", _list(c))
        r.add_get(f"{prefix}/deliveries/{{id}}", _detail(c))
        r.add_post(f"{prefix}/deliveries/{{id}}/replay", _replay_one(c))
        r.add_post(f"{prefix}/deliveries/{{id}}/suppress", _suppress(c))
        r.add_get(f"{prefix}/replays/preview", _preview(c))
        r.add_post(f"{prefix}/replays", _replay_bulk(c))
        r.add_get(f"{prefix}/replays/{{job}}", _job(c))
        r.add_get(f"{prefix}/endpoints/{{id}}", _endpoint(c))
        r.add_post(f"{prefix}/endpoints/{{id}}", _endpoint_save(c))
        r.add_post(f"{prefix}/endpoints/{{id}}/secrets", _rotate(c))
        r.add_post(f"{prefix}/endpoints/{{id}}/test-send", _test_send(c))
        r.add_get(f"{prefix}/held", _held(c))
        r.add_post(f"{prefix}/held/release", _resolve(c, "released"))
        r.add_post(f"{prefix}/held/reject", _resolve(c, "rejected"))
        r.add_get(f"{prefix}/dead-letters", _dead_letters(c))
        r.add_post(f"{prefix}/dead-letters/{{id}}/resolve", _resolve_dl(c))
        r.add_get(f"{prefix}/suppressions", _suppressions(c))
        r.add_get(f"{prefix}/audit", _audit(c))
    app.on_cleanup.append(lambda _a: asyncio.to_thread(c.pool.close))
    return app


_PUBLIC = {"/healthz", "/metrics", "/login"}
# A same-site path to return to after sign-in: no scheme, host, backslash or whitespace.
_LOCAL_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9/_.:%?&=+-]*")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _route(request: web.Request) -> str:
    info = request.match_info.route.resource
    return info.canonical if info is not None else "unmatched"


def _middleware(c: Console) -> Any:
    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        status = 500
        try:
            if request.path not in _PUBLIC:
                p, cookie = await c.principal(request)
                if p is None:
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
        except Problem as exc:
            status = exc.status
            return _problem(c, request, exc.status, str(exc), exc.extra)
        except ActionError as exc:
            status = exc.status
            return _problem(c, request, exc.status, str(exc), exc.extra)
        except (q.FilterError, OverrideError) as exc:
            status = 400
            return _problem(c, request, 400, str(exc), {})
        except q.NotFound as exc:
            status = 404
            return _problem(c, request, 404, str(exc), {})
        except ServiceUnavailable as exc:
            status = 503
            return _problem(c, request, 503, str(exc), {})
        except psycopg.OperationalError as exc:
            status = 503
            log.warning("console: database unavailable: %s", exc)
            return _problem(c, request, 503, "the database is unavailable; try again", {})
        except web.HTTPException as exc:
            status = exc.status
            raise
        except Exception:
            log.exception("console: %s %s failed", request.method, request.path)
            status = 500
            return _problem(c, request, 500, "internal error (logged)", {})
        finally:
            CONSOLE_REQUESTS.labels(_route(request), f"{status // 100}xx").observe(
                time.perf_counter() - start)

    return mw


def _problem(c: Console, request: web.Request, status: int, message: str,
             extra: Mapping[str, Any]) -> web.StreamResponse:
    if ACTION in request and 400 <= status < 500:
        _counted(request[ACTION], "refused")
    if is_api(request):
        return web.json_response({"error": message, **extra}, status=status)
    if status == 401 and request.method == "GET":
        return _redirect(f"/login?{urlencode({'next': request.path_qs})}")
    return c.render(request, "error.html", status=status, status_code=status,
                    message=message, extra=extra)


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _me(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def _staff(request: web.Request, what: str) -> Principal:
    """The principal, who must be staff: ``what`` (e.g. "dead letters are") is not visible
    to publishers."""
    p = _me(request)
    if not may(p, "read_internal"):
        raise Problem(403, f"{what} not visible to publishers")
    return p


def _counted(action: str, result: str) -> None:
    CONSOLE_ACTIONS.labels(action, result).inc()


def _doing(request: web.Request, action: str) -> None:
    """Name the action this request performs: the middleware counts it ``refused`` if the
    handler refuses it, :func:`_done` counts it ``ok``."""
    request[ACTION] = action


def _done(request: web.Request, data: Any, location: str,
          status: int = 200) -> web.StreamResponse:
    """The action succeeded: count it; JSON for the API, a redirect for the pages."""
    _counted(request[ACTION], "ok")
    if is_api(request):
        return web.json_response(data, status=status)
    return _redirect(location)


async def _home(_request: web.Request) -> web.StreamResponse:
    return _redirect("/deliveries")


async def _healthz(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _metrics(_request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _login_page(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        return c.render(request, "login.html", error=None,
                        next=request.query.get("next", "/deliveries"))
    return h


def _login(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        body = await body_of(request)
        token = text(body, "token") or ""
        nxt = text(body, "next") or "/deliveries"
        if not _LOCAL_PATH.fullmatch(nxt):
            nxt = "/deliveries"
        site = request.headers.get("Sec-Fetch-Site")
        origin = request.headers.get("Origin")
        if site == "cross-site" or (origin and origin != f"{request.scheme}://{request.host}"):
            _counted("login", "refused")
            raise Problem(403, "sign in from the console's own page")
        p = await c.pool.run(lambda conn: lookup_token(conn, token)) if token else None
        if p is None:
            _counted("login", "refused")
            return c.render(request, "login.html", status=401, error="unknown or revoked token",
                            next=nxt)
        _counted("login", "ok")
        resp = _redirect(nxt)
        resp.set_cookie(COOKIE, session_cookie(c.key, p.token_id), httponly=True,
                        samesite="Strict", path="/", max_age=8 * 3600, secure=request.secure)
        return resp
    return h


async def _logout(_request: web.Request) -> web.StreamResponse:
    resp = _redirect("/login")
    resp.del_cookie(COOKIE, path="/")
    return resp


# --- reads ------------------------------------------------------------------------------

def _list(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        flt = q.parse_filter(dict(request.query))
        rows, nxt = await c.pool.run(lambda conn: q.list_deliveries(conn, p, flt))
        params = flt.to_params()
        if flt.limit != 50:
            params["limit"] = str(flt.limit)
        next_url = f"?{urlencode({**params, 'cursor': nxt})}" if nxt else None
        data = {"deliveries": rows, "next_cursor": nxt}
        return c.reply(request, data, "deliveries.html", rows=rows, next_url=next_url,
                       f=params, statuses=q.STATUSES, query=urlencode(params))
    return h


def _detail(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        did = request.match_info["id"]
        d = await c.pool.run(lambda conn: q.delivery_detail(conn, p, did))
        return c.reply(request, d, "delivery.html", d=d, diff=None, edit={})
    return h


def _endpoint(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        eid = request.match_info["id"]
        e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
        return c.reply(request, e, "endpoint.html", e=e, problems=[], sent=None)
    return h


def _held(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        _staff(request, "held deliveries are")
        from postbacks.db.anomaly import held_cohorts, held_deliveries

        flt = {k: request.query.get(k) or None for k in ("endpoint", "reason", "app")}
        for k, v in flt.items():
            if v is not None and not q._ID.match(v):
                raise Problem(400, f"{k} {v[:60]!r} is not a valid id")
        def read(conn: psycopg.Connection[Any]) -> tuple[list[Any], list[dict[str, Any]]]:
            return (held_deliveries(conn, endpoint_id=flt["endpoint"], reason=flt["reason"],
                                    app_id=flt["app"], limit=500),
                    held_cohorts(conn, endpoint_id=flt["endpoint"], reason=flt["reason"],
                                 app_id=flt["app"]))
        held, cohorts = await c.pool.run(read)
        rows = [{"delivery_id": x.delivery_id, "endpoint_id": x.endpoint_id,
                 "app_id": x.app_id, "hold_reason": x.hold_reason, "held_at_ms": x.held_at_ms,
                 "payout_usd_micros": x.payout_usd_micros, "idempotency_key": x.idempotency_key}
                for x in held]
        data = {"held": rows, "cohorts": cohorts}
        return c.reply(request, data, "held.html", rows=rows, cohorts=cohorts,
                       f={k: v for k, v in flt.items() if v})
    return h


def _dead_letters(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _staff(request, "dead letters are")
        unresolved = request.query.get("all") != "1"
        rows = await c.pool.run(lambda conn: q.dead_letters(conn, p, unresolved=unresolved))
        return c.reply(request, {"dead_letters": rows}, "dead_letters.html", rows=rows,
                       unresolved=unresolved)
    return h


def _suppressions(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _staff(request, "suppressions are")
        rows = await c.pool.run(lambda conn: q.suppressions(conn, p))
        return c.reply(request, {"suppressions": rows}, "suppressions.html", rows=rows)
    return h


def _audit(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        _staff(request, "the audit log is")
        f = {k: request.query.get(k) or None for k in ("target_type", "target_id", "actor")}
        rows = await c.pool.run(lambda conn: q.audit_rows(
            conn, target_type=f["target_type"], target_id=f["target_id"], actor=f["actor"]))
        return c.reply(request, {"audit": rows}, "audit.html", rows=rows,
                       f={k: v for k, v in f.items() if v})
    return h


def _job(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        if not may(p, "replay"):
            raise Problem(403, f"a {p.role} may not see replay jobs")
        job = request.match_info["job"]
        status = await c.pool.run(lambda conn: act.job_status(conn, job))
        return c.reply(request, status, "replay_job.html", job=status)
    return h


# --- actions ----------------------------------------------------------------------------

def _replay_one(c: Console) -> Handler:
    """Replay one delivery; with url/fields/aliases it is an edit & replay: the first POST
    (without ``confirm=1``) shows the diff, the second queues it."""
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        did = request.match_info["id"]
        body = await body_of(request)
        override = override_from(body)
        note = text(body, "note")
        promote = flag(body, "promote")
        confirmed = flag(body, "confirm") or is_api(request)
        _doing(request, "edit_replay" if override else "replay")
        if not may(p, "replay"):
            raise Problem(403, f"a {p.role} may not replay deliveries")
        if override is not None and not confirmed:
            d, diff = await c.pool.run(lambda conn: act.preview_edit(
                conn, c.settings, p, did, override, lookup=c.lookup))
            return c.render(request, "delivery.html", d=d, diff=diff,
                            edit={"url": override.url or "",
                                  "fields": ",".join(override.fields or ()),
                                  "aliases": json.dumps(dict(override.aliases))
                                  if override.aliases is not None else "",
                                  "note": note or "", "promote": promote})
        job = await c.pool.run(lambda conn: act.create_replay(
            conn, c.settings, p, delivery_ids=[did], override=override, note=note,
            promote=promote, confirm_token=text(body, "confirm_token"), lookup=c.lookup))
        return _done(request, {"job_id": job.job_id, "total": job.total,
                               "diff": [list(x) for x in job.diff]},
                     f"/replays/{job.job_id}", status=202)
    return h


def _preview(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        flt = filter_from(dict(request.query))
        pv = await c.pool.run(lambda conn: act.replay_preview(conn, p, flt, c.settings))
        return c.reply(request, pv, "replay_preview.html", pv=pv, f=flt.to_params())
    return h


def _replay_bulk(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        body = await body_of(request)
        ids = id_list(body, "delivery_ids")
        _doing(request, "replay" if ids else "bulk_replay")
        flt = None if ids else filter_from(body)
        job = await c.pool.run(lambda conn: act.create_replay(
            conn, c.settings, p, delivery_ids=ids, flt=flt, note=text(body, "note"),
            confirm=whole(body, "confirm"), lookup=c.lookup))
        return _done(request, {"job_id": job.job_id, "total": job.total,
                               "skipped": job.skipped},
                     f"/replays/{job.job_id}", status=202)
    return h


def _suppress(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        did = request.match_info["id"]
        _doing(request, "suppress")
        body = await body_of(request)
        await c.pool.run(lambda conn: act.suppress_delivery(conn, p, did,
                                                            text(body, "reason") or ""))
        return _done(request, {"suppressed": did}, f"/deliveries/{did}")
    return h


def _resolve_dl(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        dl = request.match_info["id"]
        _doing(request, "resolve_dead_letter")
        body = await body_of(request)
        await c.pool.run(lambda conn: act.resolve_dead_letter(conn, p, dl, text(body, "note")))
        return _done(request, {"resolved": dl}, "/dead-letters")
    return h


def _resolve(c: Console, kind: str) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        from postbacks.tools.held import HeldError, NeedsConfirmation, resolve_held

        p = _me(request)
        _doing(request, f"held_{kind}")
        if not may(p, "resolve_held"):
            raise Problem(403, f"only a reviewer may release or reject held deliveries "
                          f"(you are {p.role})")
        body = await body_of(request)
        ids = id_list(body, "delivery_ids")
        kw = {k: text(body, k) for k in ("endpoint", "reason", "app")}
        try:
            r = await asyncio.to_thread(
                resolve_held, c.settings, kind=kind, actor=p.actor, note=text(body, "note"),
                delivery_ids=ids, endpoint=kw["endpoint"], reason=kw["reason"],
                app=kw["app"], all_=flag(body, "all"),
                confirm=whole(body, "confirm"))
        except NeedsConfirmation as exc:
            raise Problem(409, str(exc), needs_confirmation=exc.count) from exc
        except HeldError as exc:
            raise Problem(400 if exc.code == 2 else 409, str(exc)) from exc
        _counted(request[ACTION], "ok")
        data = {"kind": r.kind, "delivery_ids": list(r.delivery_ids),
                "skipped": list(r.skipped), "limit_reached": r.limit_reached}
        if is_api(request):
            return web.json_response(data)
        return c.render(request, "resolved.html", r=data)
    return h


def _endpoint_save(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        _doing(request, "endpoint_save")
        eid = request.match_info["id"]
        body = await body_of(request)
        config = body.get("config")
        if isinstance(config, str):
            try:
                config = json.loads(config) if config.strip() else None
            except ValueError as exc:
                raise Problem(400, f"config is not JSON: {exc}") from exc
        if config is not None and not isinstance(config, dict):
            raise Problem(400, "config must be a JSON object")
        raw_types = body.get("event_types")
        if isinstance(raw_types, list) and is_api(request):
            types: list[str] | None = [str(t) for t in raw_types]
        else:
            listed = text(body, "event_types")
            types = listed.split(",") if listed else None
        problems = await c.pool.run(lambda conn: eps.save_endpoint(
            conn, c.settings, p, eid, url=text(body, "url"), config=config,
            event_types=types,
            confirm_token=text(body, "confirm_token"), note=text(body, "note"),
            lookup=c.lookup))
        if problems:
            _counted(request[ACTION], "refused")
            if is_api(request):
                return web.json_response({"error": "endpoint not saved", "problems": problems},
                                         status=422)
            e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
            return c.render(request, "endpoint.html", status=422, e=e, problems=problems,
                            sent=None)
        return _done(request, {"saved": eid}, f"/endpoints/{eid}")
    return h


def _rotate(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        _doing(request, "rotate_secret")
        eid = request.match_info["id"]
        body = await body_of(request)
        secret = text(body, "secret")
        if not secret:
            raise Problem(400, "secret is required (whsec_...)")
        overlap = whole(body, "overlap_s")
        sid = await c.pool.run(lambda conn: eps.add_secret(
            conn, c.settings, p, eid, secret,
            overlap_s=float(overlap if overlap is not None else 86400)))
        return _done(request, {"secret_id": sid}, f"/endpoints/{eid}")
    return h


def _test_send(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        _doing(request, "test_send")
        eid = request.match_info["id"]
        if not may(p, "test_send"):
            raise Problem(403, f"a {p.role} may not test-send")
        body = await body_of(request)
        override = override_from(body)
        if override is not None and override.url is not None:
            why = await asyncio.to_thread(eps.check_target, override.url,
                                          allow_loopback=c.settings.allow_loopback_targets,
                                          lookup=c.lookup)
            if why:
                raise Problem(400, f"test-send refused: {why}")
        ep = await c.pool.run(lambda conn: eps.load_for_test_send(conn, c.settings, p, eid))
        sent = await eps.test_send(c.settings, ep, override=override)

        await c.pool.run(lambda conn: eps.audit_test_send(conn, p, eid, sent))
        _counted(request[ACTION], "ok" if sent["ok"] else "refused")
        if is_api(request):
            return web.json_response(sent)
        e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
        return c.render(request, "endpoint.html", e=e, problems=[], sent=sent)
    return h


# --- serve ------------------------------------------------------------------------------

def serve(settings: Settings, *, host: str | None = None, port: int | None = None,
          drain: bool = True) -> None:
    """Run the console (and the replay drainer, in a thread) until SIGINT/SIGTERM."""
    from postbacks.console.drain import run_drainer

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
