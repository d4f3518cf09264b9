"""The console's request plumbing, shared by its read pages (:mod:`.web`) and its actions
(:mod:`.writes`): the :class:`Console` (settings, connection pool, session key, templates),
the request keys the middleware sets, and the small helpers every handler uses to refuse,
redirect, count and answer."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
from aiohttp import web

from postbacks.cli_output import usd
from postbacks.metrics import CONSOLE_ACTIONS
from postbacks.settings import Settings
from replay_console.auth import Principal, csrf_for, lookup_session, lookup_token, may
from replay_console.forms import Problem, is_api
from replay_console.pool import ConnPool
from replay_console.rules import Lookup

__all__ = ["ACTION", "COOKIE", "COOKIE_VALUE", "PRINCIPAL", "Console", "Handler", "counted",
           "doing", "done", "me", "problem", "redirect", "staff"]

PRINCIPAL = web.RequestKey("principal", Principal)
COOKIE_VALUE = web.RequestKey("cookie", str)
ACTION = web.RequestKey("action", str)  # the action a POST performs (metrics)
COOKIE = "pb_session"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- helpers ----------------------------------------------------------------------------

def _when(ms: int | None) -> str:
    if ms is None:
        return "—"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _jsonpretty(v: Any) -> str:
    return json.dumps(v, indent=2, sort_keys=True, default=str)


def _env() -> jinja2.Environment:
    folder = resources.files("replay_console") / "templates"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)), autoescape=True,
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    env.filters.update(when=_when, usd=usd, pretty=_jsonpretty)
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


def problem(c: Console, request: web.Request, status: int, message: str,
            extra: Mapping[str, Any]) -> web.StreamResponse:
    if ACTION in request and 400 <= status < 500:
        counted(request[ACTION], "refused")
    if is_api(request):
        return web.json_response({"error": message, **extra}, status=status)
    if status == 401 and request.method == "GET":
        return redirect(f"/login?{urlencode({'next': request.path_qs})}")
    return c.render(request, "error.html", status=status, status_code=status,
                    message=message, extra=extra)


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def me(request: web.Request) -> Principal:
    return request[PRINCIPAL]


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
