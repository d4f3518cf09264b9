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
import contextlib
import datetime as dt
import hashlib
import json
import logging
import queue
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import urlencode

import jinja2
import psycopg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from psycopg.types.json import Jsonb

from postbacks.console import actions as act
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
from postbacks.core.override import Override, OverrideError, parse_override
from postbacks.db.connect import connect
from postbacks.errors import ServiceUnavailable
from postbacks.metrics import CONSOLE_ACTIONS, CONSOLE_REQUESTS
from postbacks.settings import Settings
from postbacks.tools.cli_output import usd

__all__ = ["ConnPool", "make_app", "serve"]

log = logging.getLogger("postbacks.console")
T = TypeVar("T")
PRINCIPAL = web.RequestKey("principal", Principal)
COOKIE_VALUE = web.RequestKey("cookie", str)
BODY = web.RequestKey("body", dict)
COOKIE = "pb_session"
MAX_BODY = 64 * 1024  # forms and JSON bodies; an edit is far smaller


class ConnPool:
    """A few PostgreSQL connections used from worker threads, one per call."""

    def __init__(self, database_url: str, size: int = 4) -> None:
        self._url = database_url
        self._free: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._sem = threading.BoundedSemaphore(size)

    def call(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``fn`` in a transaction on a pooled connection (commit if it returns)."""
        with self._sem:
            try:
                conn = self._free.get_nowait()
            except queue.Empty:
                conn = connect(self._url)
            ok = False
            try:
                result = fn(conn)
                conn.commit()
                ok = True
                return result
            finally:
                if ok:
                    self._free.put(conn)
                else:
                    with contextlib.suppress(psycopg.Error):
                        conn.rollback()
                    if conn.closed or conn.info.transaction_status != 0:
                        conn.close()
                    else:
                        self._free.put(conn)

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        return await asyncio.to_thread(self.call, fn)

    def close(self) -> None:
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                return


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


class Problem(Exception):
    """An error the page and the API show as is."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


def _is_api(request: web.Request) -> bool:
    return request.path.startswith("/api/")


async def _body(request: web.Request) -> dict[str, Any]:
    """The request's form or JSON body as a dict (bounded; parsed once per request)."""
    if BODY in request:
        cached: dict[str, Any] = request[BODY]
        return cached
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise Problem(413, f"request body larger than {MAX_BODY} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise Problem(413, f"request body larger than {MAX_BODY} bytes") from exc
    request[BODY] = out = _parse_body(request, raw)
    return out


def _parse_body(request: web.Request, raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    if request.content_type == "application/json":
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise Problem(400, f"body is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise Problem(400, "body must be a JSON object")
        return data
    from urllib.parse import parse_qs

    try:
        form = parse_qs(raw.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError as exc:
        raise Problem(400, "form is not UTF-8") from exc
    return {k: (v if len(v) > 1 else v[0]) for k, v in form.items()}


def _str(body: Mapping[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, list):
        raise Problem(400, f"{key} given more than once")
    if not isinstance(v, str | int):
        raise Problem(400, f"{key} must be a string")
    text = str(v).strip()
    return text or None


def _flag(body: Mapping[str, Any], key: str) -> bool:
    """A checkbox or a JSON boolean."""
    v = body.get(key)
    if isinstance(v, bool):
        return v
    return isinstance(v, str | int) and str(v).strip().lower() in ("1", "true", "on", "yes")


def _ids(body: Mapping[str, Any], key: str) -> list[str]:
    v = body.get(key)
    if v is None:
        return []
    items = v if isinstance(v, list) else str(v).replace(",", " ").split()
    out = [str(i).strip() for i in items if str(i).strip()]
    if len(out) > 10_000:
        raise Problem(400, f"{key}: at most 10000 ids")
    return out


def _int(body: Mapping[str, Any], key: str) -> int | None:
    v = _str(body, key)
    if v is None:
        return None
    if not (v.isascii() and v.isdigit()) or len(v) > 12:
        raise Problem(400, f"{key} must be a whole number")
    return int(v)


def _override_from(body: Mapping[str, Any]) -> Override | None:
    """An edit from a JSON ``override`` object or the form's url/fields/aliases fields."""
    try:
        if isinstance(body.get("override"), dict):
            return parse_override(body["override"])
        raw: dict[str, Any] = {}
        url = _str(body, "url")
        if url:
            raw["url"] = url
        fields = _str(body, "fields")
        if fields:
            raw["fields"] = [f.strip() for f in fields.split(",") if f.strip()]
        aliases = _str(body, "aliases")
        if aliases:
            try:
                raw["aliases"] = json.loads(aliases)
            except ValueError as exc:
                raise OverrideError(f"aliases must be a JSON object: {exc}") from exc
        return parse_override(raw) if raw else None
    except OverrideError as exc:
        raise Problem(400, str(exc)) from exc


# --- the app ----------------------------------------------------------------------------

class Console:
    def __init__(self, settings: Settings, pool: ConnPool, lookup: act.Lookup | None) -> None:
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
        if _is_api(request) or page is None:
            return web.json_response(data, status=status, dumps=lambda v: json.dumps(
                v, default=str))
        return self.render(request, page, status=status, data=data, **ctx)


def make_app(settings: Settings, *, lookup: act.Lookup | None = None,
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
                        v = (await _body(request)).get("csrf")
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
        except act.ActionError as exc:
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
    if _is_api(request):
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
        body = await _body(request)
        token = _str(body, "token") or ""
        nxt = _str(body, "next") or "/deliveries"
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
        body = await _body(request)
        override = _override_from(body)
        note = _str(body, "note")
        promote = _flag(body, "promote")
        confirmed = _flag(body, "confirm") or _is_api(request)
        if not may(p, "replay"):
            raise Problem(403, f"a {p.role} may not replay deliveries")
        if override is not None and not confirmed:
            def preview(conn: psycopg.Connection[Any]) -> tuple[dict[str, Any], Any]:
                d = q.delivery_detail(conn, p, did)
                ep = act.load_endpoint(conn, d["endpoint_id"])
                from postbacks.core.override import override_diff

                why = act.check_target(override.url, allow_loopback=c.settings
                                       .allow_loopback_targets, lookup=c.lookup) \
                    if override.url else None
                if why:
                    raise act.ActionError(f"edit refused: {why}", 400)
                return d, override_diff(ep, override)
            d, diff = await c.pool.run(preview)
            return c.render(request, "delivery.html", d=d, diff=diff,
                            edit={"url": override.url or "",
                                  "fields": ",".join(override.fields or ()),
                                  "aliases": json.dumps(dict(override.aliases))
                                  if override.aliases is not None else "",
                                  "note": note or "", "promote": promote})
        try:
            job = await c.pool.run(lambda conn: act.create_replay(
                conn, c.settings, p, delivery_ids=[did], override=override, note=note,
                promote=promote, confirm_token=_str(body, "confirm_token"), lookup=c.lookup))
        except act.ActionError:
            _counted("replay", "refused")
            raise
        _counted("edit_replay" if override else "replay", "ok")
        data = {"job_id": job.job_id, "total": job.total,
                "diff": [list(x) for x in job.diff]}
        if _is_api(request):
            return web.json_response(data, status=202)
        return _redirect(f"/replays/{job.job_id}")
    return h


def _filter_from(body: Mapping[str, Any]) -> q.DeliveryFilter:
    raw = body.get("filter") if isinstance(body.get("filter"), dict) else {
        k: v for k, v in body.items() if k in ("app", "endpoint", "status", "error", "since",
                                               "until")}
    if not isinstance(raw, dict):
        raise Problem(400, "filter must be an object")
    params = {str(k): str(v) for k, v in raw.items() if v not in (None, "")}
    if not params:
        raise Problem(400, "a bulk replay needs at least one filter (app, endpoint, status, "
                      "error, since, until)")
    return q.parse_filter(params)


def _preview(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        flt = _filter_from(dict(request.query))
        pv = await c.pool.run(lambda conn: act.replay_preview(conn, p, flt, c.settings))
        return c.reply(request, pv, "replay_preview.html", pv=pv, f=flt.to_params())
    return h


def _replay_bulk(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        body = await _body(request)
        ids = _ids(body, "delivery_ids")
        flt = None if ids else _filter_from(body)
        try:
            job = await c.pool.run(lambda conn: act.create_replay(
                conn, c.settings, p, delivery_ids=ids, flt=flt, note=_str(body, "note"),
                confirm=_int(body, "confirm"), lookup=c.lookup))
        except act.ActionError:
            _counted("bulk_replay", "refused")
            raise
        _counted("bulk_replay" if flt else "replay", "ok")
        data = {"job_id": job.job_id, "total": job.total, "skipped": job.skipped}
        if _is_api(request):
            return web.json_response(data, status=202)
        return _redirect(f"/replays/{job.job_id}")
    return h


def _suppress(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        did = request.match_info["id"]
        body = await _body(request)
        await c.pool.run(lambda conn: act.suppress_delivery(conn, p, did,
                                                            _str(body, "reason") or ""))
        _counted("suppress", "ok")
        if _is_api(request):
            return web.json_response({"suppressed": did})
        return _redirect(f"/deliveries/{did}")
    return h


def _resolve_dl(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        dl = request.match_info["id"]
        body = await _body(request)
        await c.pool.run(lambda conn: act.resolve_dead_letter(conn, p, dl, _str(body, "note")))
        _counted("resolve_dead_letter", "ok")
        if _is_api(request):
            return web.json_response({"resolved": dl})
        return _redirect("/dead-letters")
    return h


def _resolve(c: Console, kind: str) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        from postbacks.tools.held import HeldError, NeedsConfirmation, resolve_held

        p = _me(request)
        if not may(p, "resolve_held"):
            _counted(f"held_{kind}", "refused")
            raise Problem(403, f"only a reviewer may release or reject held deliveries "
                          f"(you are {p.role})")
        body = await _body(request)
        ids = _ids(body, "delivery_ids")
        kw = {k: _str(body, k) for k in ("endpoint", "reason", "app")}
        try:
            r = await asyncio.to_thread(
                resolve_held, c.settings, kind=kind, actor=p.actor, note=_str(body, "note"),
                delivery_ids=ids, endpoint=kw["endpoint"], reason=kw["reason"],
                app=kw["app"], all_=_flag(body, "all"),
                confirm=_int(body, "confirm"))
        except NeedsConfirmation as exc:
            raise Problem(409, str(exc), needs_confirmation=exc.count) from exc
        except HeldError as exc:
            raise Problem(400 if exc.code == 2 else 409, str(exc)) from exc
        _counted(f"held_{kind}", "ok")
        data = {"kind": r.kind, "delivery_ids": list(r.delivery_ids),
                "skipped": list(r.skipped), "limit_reached": r.limit_reached}
        if _is_api(request):
            return web.json_response(data)
        return c.render(request, "resolved.html", r=data)
    return h


def _endpoint_save(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        eid = request.match_info["id"]
        body = await _body(request)
        config = body.get("config")
        if isinstance(config, str):
            try:
                config = json.loads(config) if config.strip() else None
            except ValueError as exc:
                raise Problem(400, f"config is not JSON: {exc}") from exc
        if config is not None and not isinstance(config, dict):
            raise Problem(400, "config must be a JSON object")
        raw_types = body.get("event_types")
        if isinstance(raw_types, list) and _is_api(request):
            types: list[str] | None = [str(t) for t in raw_types]
        else:
            text = _str(body, "event_types")
            types = text.split(",") if text else None
        problems = await c.pool.run(lambda conn: act.save_endpoint(
            conn, c.settings, p, eid, url=_str(body, "url"), config=config,
            event_types=types,
            confirm_token=_str(body, "confirm_token"), note=_str(body, "note"),
            lookup=c.lookup))
        _counted("endpoint_save", "refused" if problems else "ok")
        if problems:
            if _is_api(request):
                return web.json_response({"error": "endpoint not saved", "problems": problems},
                                         status=422)
            e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
            return c.render(request, "endpoint.html", status=422, e=e, problems=problems,
                            sent=None)
        if _is_api(request):
            return web.json_response({"saved": eid})
        return _redirect(f"/endpoints/{eid}")
    return h


def _rotate(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        eid = request.match_info["id"]
        body = await _body(request)
        secret = _str(body, "secret")
        if not secret:
            raise Problem(400, "secret is required (whsec_...)")
        overlap = _int(body, "overlap_s")
        sid = await c.pool.run(lambda conn: act.add_secret(
            conn, c.settings, p, eid, secret,
            overlap_s=float(overlap if overlap is not None else 86400)))
        _counted("rotate_secret", "ok")
        if _is_api(request):
            return web.json_response({"secret_id": sid})
        return _redirect(f"/endpoints/{eid}")
    return h


def _test_send(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = _me(request)
        eid = request.match_info["id"]
        if not may(p, "test_send"):
            raise Problem(403, f"a {p.role} may not test-send")
        body = await _body(request)
        override = _override_from(body)
        if override is not None and override.url is not None:
            why = await asyncio.to_thread(act.check_target, override.url,
                                          allow_loopback=c.settings.allow_loopback_targets,
                                          lookup=c.lookup)
            if why:
                raise Problem(400, f"test-send refused: {why}")
        ep = await c.pool.run(lambda conn: act.load_for_test_send(conn, c.settings, p, eid))
        sent = await act.test_send(c.settings, ep, override=override)

        def audit(conn: psycopg.Connection[Any]) -> None:
            conn.execute(
                "INSERT INTO audit_log (actor, action, target_type, target_id, after)"
                " VALUES (%s, 'endpoint.test_send', 'endpoint', %s, %s)",
                (p.actor, eid, Jsonb(
                    {"ok": sent["ok"], "url": sent.get("request", {}).get("url"),
                     "status": sent.get("response", {}).get("status")})))
        await c.pool.run(audit)
        _counted("test_send", "ok" if sent["ok"] else "refused")
        if _is_api(request):
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
