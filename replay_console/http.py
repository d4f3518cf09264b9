"""The console's request plumbing, shared by its read pages (:mod:`.web`) and its actions
(:mod:`.writes`): the :class:`Console` (settings, connection pool, session key, templates),
the request keys the middleware sets, and the small helpers every handler uses to refuse,
redirect, count and answer."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import ipaddress
import json
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import urlencode, urlsplit

import jinja2
import psycopg
from aiohttp import web

from postbacks.cli_output import usd
from postbacks.core.ssrf import parse_networks
from postbacks.errors import ServiceUnavailable
from postbacks.metrics import CONSOLE_ACTIONS
from postbacks.settings import Settings
from replay_console.auth import Principal, csrf_for, lookup_session, lookup_token, may
from replay_console.forms import is_api
from replay_console.guard import session_cookie_in
from replay_console.pool import ConnPool
from replay_console.problem import Problem
from replay_console.rules import Lookup
from replay_console.throttle import ActionLimit

__all__ = ["ACTION", "COOKIE", "COOKIE_VALUE", "CSP", "LOCAL_PATH", "PRINCIPAL", "REFUSED",
           "Console",
           "Handler", "counted", "doing", "done", "me", "not_for_publishers", "problem",
           "redirect", "staff"]

PRINCIPAL = web.RequestKey("principal", Principal)
COOKIE_VALUE = web.RequestKey("cookie", str)
ACTION = web.RequestKey("action", str)  # the action a POST performs (metrics)
# a refusal the handler answers itself (a 422 page) that is audited as a 403 would be
REFUSED = web.RequestKey("refused", str)
COOKIE = "pb_session"
PREVIEWS_AT_ONCE = 2  # re-render previews rendering at once per console instance
AUTH_CONNECTIONS = 2  # connections that check credentials, apart from the pages' pool
AUTH_TIMEOUT_MS = 5_000  # a credential check is one indexed lookup
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# No script at all, styles only from the console's own stylesheet, no framing.
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
HSTS = "max-age=31536000"
# A same-site path to return to: no scheme, host, backslash or whitespace.
LOCAL_PATH = re.compile(r"/(?![/\\])[A-Za-z0-9/_.:%?&=+-]*")


# --- helpers ----------------------------------------------------------------------------

def _when(ms: int | None) -> str:
    if ms is None:
        return "—"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _jsonpretty(v: Any) -> str:
    return json.dumps(v, indent=2, sort_keys=True, default=str)


def _short(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _changes(before: Any, after: Any) -> list[str]:
    """An audit row's before/after as lines a person reads: ``key: old → new`` for each
    key that changed (objects), else the two values."""
    if isinstance(before, Mapping) or isinstance(after, Mapping):
        b = before if isinstance(before, Mapping) else {}
        a = after if isinstance(after, Mapping) else {}
        out = []
        for k in sorted(set(b) | set(a), key=str):
            if k not in b:
                out.append(f"{k}: {_short(a[k])}")
            elif k not in a:
                out.append(f"{k}: {_short(b[k])} → (removed)")
            elif b[k] != a[k]:
                out.append(f"{k}: {_short(b[k])} → {_short(a[k])}")
        return out
    if before is None and after is None:
        return []
    return [f"{_short(before)} → {_short(after)}" if before is not None else _short(after)]


def _env() -> jinja2.Environment:
    folder = resources.files("replay_console") / "templates"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters.update(when=_when, usd=usd, pretty=_jsonpretty, changes=_changes)
    return env


# --- the console ------------------------------------------------------------------------

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
        # credentials are checked on connections of their own, under a short timeout: a
        # few slow page queries holding the pool stalled every sign-in and every request
        self.auth_pool = ConnPool(settings.database_url, size=AUTH_CONNECTIONS,
                                  statement_timeout_ms=AUTH_TIMEOUT_MS)
        self.in_flight: dict[str, int] = {}  # requests running per actor (see .busy)
        self.previews = asyncio.Semaphore(PREVIEWS_AT_ONCE)  # re-render previews running
        self.previewing: set[str] = set()  # the actors with one running
        self.test_sends = ActionLimit(  # this instance's own counts
            "test-send", per_target=settings.console_test_sends_per_endpoint,
            per_actor=settings.console_test_sends_per_user)
        self.trusted_proxies = parse_networks(settings.console_trusted_proxies)

    # transport ----------------------------------------------------------------------

    def is_tls(self, request: web.Request) -> bool:
        """Whether the browser reached the console over TLS: this connection is TLS, or
        it comes from a trusted proxy (``POSTBACKS_CONSOLE_TRUSTED_PROXIES``) that says
        ``X-Forwarded-Proto: https``. Decides the cookie's Secure flag and HSTS."""
        if request.secure:
            return True
        proto = request.headers.get("X-Forwarded-Proto", "")
        if proto.split(",")[0].strip().lower() != "https" or not self.trusted_proxies:
            return False
        try:
            peer = ipaddress.ip_address(request.remote or "")
        except ValueError:
            return False
        return any(peer in net for net in self.trusted_proxies)

    def origin(self, request: web.Request) -> str:
        """This console's origin as the browser sees it."""
        return f"{'https' if self.is_tls(request) else 'http'}://{request.host}"

    def secure_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """The security headers every response carries (pages, API, errors, static)."""
        for k, v in _HEADERS.items():
            response.headers.setdefault(k, v)
        if request.path.startswith("/api/"):  # signed-in data (and a new secret, once)
            response.headers.setdefault("Cache-Control", "no-store")
        if self.is_tls(request):
            response.headers["Strict-Transport-Security"] = HSTS

    # auth ---------------------------------------------------------------------------

    async def principal(self, request: web.Request) -> tuple[Principal | None, str | None]:
        """The principal and, when signed in by cookie, the cookie (for CSRF)."""
        auth = request.headers.get("Authorization", "")
        try:
            if auth.startswith("Bearer "):
                token = auth[7:].strip()
                return await self.auth_pool.run(lambda c: lookup_token(c, token)), None
            cookie = session_cookie_in(request)
            if cookie:
                p = await self.auth_pool.run(lambda c: lookup_session(c, self.key, cookie))
                return p, cookie if p else None
        except psycopg.errors.QueryCanceled:
            raise ServiceUnavailable(  # (its own words, not the pages' "narrow it")
                f"checking credentials ran over {AUTH_TIMEOUT_MS / 1000:g} s") from None
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


def problem(c: Console, request: web.Request, status: int, message: str,
            extra: Mapping[str, Any]) -> web.StreamResponse:
    if ACTION in request and 400 <= status < 500:
        counted(request[ACTION], "refused")
    if is_api(request):
        return web.json_response({"error": message, **extra}, status=status)
    if status == 401 and request.method == "GET":
        return redirect(f"/login?{urlencode({'next': request.path_qs})}")
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Error"
    back, back_label = _back(request)
    return c.render(request, "error.html", status=status, status_code=status, reason=reason,
                    message=message, extra=extra, back=back, back_label=back_label)


_SECTIONS = {"deliveries": "Deliveries", "held": "Held deliveries",
             "dead-letters": "Dead letters", "suppressions": "Suppressions",
             "audit": "Audit log"}


def _back(request: web.Request) -> tuple[str, str]:
    """Where an error page links back to: the page the browser came from when it says so
    (same origin), else the section the failed page belongs to, else home."""
    ref = request.headers.get("Referer")
    if ref:
        u = urlsplit(ref)
        path = u.path + (f"?{u.query}" if u.query else "")
        if u.netloc == request.host and LOCAL_PATH.fullmatch(path) and path != request.path_qs:
            return path, "Back to the previous page"
    p: Principal | None = request.get(PRINCIPAL)
    section = request.path.strip("/").split("/")[0]
    if section in _SECTIONS and p is not None and (section == "deliveries" or
                                                    may(p, "read_internal")):
        target = f"/{section}"
        if target != request.path_qs:
            return target, f"Back to {_SECTIONS[section].lower()}"
    return "/deliveries", "Home"


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def me(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def not_for_publishers(request: web.Request) -> Principal:
    """The principal, who must be staff; a publisher gets a plain 404, as for any page
    that does not exist (the held deliveries and their review are not a publisher's)."""
    p = me(request)
    if not may(p, "read_internal"):
        raise Problem(404, "no such page")
    return p


def staff(request: web.Request, what: str) -> Principal:
    """The principal, who must be staff: ``what`` (e.g. "dead letters are") is not visible
    to publishers."""
    p = me(request)
    if not may(p, "read_internal"):
        raise Problem(403, f"{what} not visible to publishers")
    return p


def counted(action: str, result: str) -> None:
    CONSOLE_ACTIONS.labels(action, result).inc()


def doing(request: web.Request, action: str) -> None:
    """Name the action this request performs: the middleware counts it ``refused`` if the
    handler refuses it, :func:`done` counts it ``ok``."""
    request[ACTION] = action


def done(request: web.Request, data: Any, location: str,
         status: int = 200) -> web.StreamResponse:
    """The action succeeded: count it; JSON for the API, a redirect for the pages."""
    counted(request[ACTION], "ok")
    if is_api(request):
        return web.json_response(data, status=status)
    return redirect(location)
