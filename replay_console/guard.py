"""Where input enters the console: one check of every path segment, query parameter,
header and cookie (:func:`check_request`, run by the middleware before sign-in) and of
every body value (:func:`check_body`, run when the body is parsed), so no handler, query
or hash ever sees a NUL byte, a lone surrogate (bytes that were not UTF-8), an over-long
value or a nesting it cannot handle. A refusal is a 4xx that names the input, never a 5xx.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from aiohttp import web

from replay_console.filters import ID
from replay_console.problem import Problem

__all__ = ["MAX_DEPTH", "MAX_PARAM", "check_body", "check_request", "clean", "session_cookie_in"]

MAX_PATH = 2048  # characters of the decoded path
MAX_PARAM = 1000  # characters of one query parameter (name or value)
MAX_PARAMS = 50
MAX_DEPTH = 8  # nesting of a JSON body
MAX_INT = 2**63 - 1  # PostgreSQL bigint
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Credentials are ASCII: a bearer token (pbc_ + url-safe base64), a session cookie
# (<token_id>.<expires>.<hex>) and a CSRF token (hex).
_BEARER = re.compile(r"[\x21-\x7e]{1,512}", re.ASCII)
_COOKIE = re.compile(r"[A-Za-z0-9_.:-]{1,400}", re.ASCII)
_CSRF = re.compile(r"[0-9a-f]{1,128}", re.ASCII)


def clean(value: str, what: str, *, limit: int, controls: bool = False) -> str:
    """``value`` if it is text PostgreSQL and the pages can hold, else a 400 naming
    ``what``: no NUL, valid UTF-8, at most ``limit`` characters, and no control
    characters unless ``controls`` (tabs and newlines in a body's text)."""
    if "\x00" in value:
        raise Problem(400, f"{what} contains a NUL byte")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Problem(400, f"{what} is not valid UTF-8") from None
    if len(value) > limit:
        raise Problem(400, f"{what} is longer than {limit} characters")
    if not controls and _CONTROL.search(value):
        raise Problem(400, f"{what} contains a control character")
    return value


def check_request(request: web.Request) -> None:
    """Refuse a request whose path, query, credential headers or cookie are malformed, or
    that gives a query parameter more than once."""
    clean(request.path, "the path", limit=MAX_PATH)
    for key, value in request.match_info.items():
        if not ID.match(value):  # every path parameter is an id
            raise Problem(404, f"no such {key}: not a valid id")
    query = request.query
    if len(query) > MAX_PARAMS:
        raise Problem(400, f"at most {MAX_PARAMS} query parameters")
    for key, value in query.items():
        clean(key, "a query parameter name", limit=MAX_PARAM)
        clean(value, f"query parameter {key}", limit=MAX_PARAM)
    if len(set(query)) != len(query):  # a handler would read one and ignore the others
        key = next(k for k in query if len(query.getall(k)) > 1)
        raise Problem(400, f"query parameter {key} given {len(query.getall(key))} times: "
                      "give it once")
    auth = request.headers.get("Authorization")
    if auth is not None and auth.startswith("Bearer ") and not _BEARER.fullmatch(auth[7:].strip()):
        raise Problem(401, "the bearer token is malformed (a console token is pbc_...)")
    csrf = request.headers.get("X-CSRF-Token")
    if csrf is not None and not _CSRF.fullmatch(csrf):
        raise Problem(403, "the X-CSRF-Token header is malformed: reload the page and try again")
    for name in ("Cookie", "Origin", "Referer", "Sec-Fetch-Site", "Content-Type", "Host"):
        v = request.headers.get(name)
        if v is not None:
            clean(v, f"the {name} header", limit=8192)
    try:
        _ = request.cookies  # (a malformed session cookie is not refused: session_cookie_in)
    except Exception:  # a Cookie header the parser cannot read
        raise Problem(400, "the Cookie header is malformed") from None


def session_cookie_in(request: web.Request) -> str | None:
    """The request's session cookie when it is one this console could have set, else None.
    A malformed one counts as absent rather than refused: refusing it refused the sign-in
    page too, so a cookie planted by a neighbouring site or subdomain locked its holder out
    (every page, /login included, redirected to /login)."""
    value = request.cookies.get("pb_session")
    return value if value and _COOKIE.fullmatch(value) else None


def json_text(raw: str, what: str) -> Any:
    """A JSON value given as text inside a body or on a command line (an endpoint's
    config, an override's aliases), held to :func:`check_body`'s rules: no NaN or
    Infinity, no NUL or other control characters, no deep nesting (PostgreSQL's jsonb
    stores none of them, and the save failed there as a 500)."""
    def refuse(constant: str) -> Any:
        raise Problem(400, f"{what} holds {constant}: only finite numbers are allowed")

    try:
        value = json.loads(raw, parse_constant=refuse)
    except ValueError as exc:
        raise Problem(400, f"{what} is not JSON: {str(exc)[:200]}") from exc
    except RecursionError:
        raise Problem(400, f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    try:
        check_body(value, what)
    except Problem as exc:
        message = str(exc)
        raise Problem(exc.status, message if message.startswith(what) else
                      f"{what}: {message}") from None
    return value


def check_body(value: Any, what: str = "body", depth: int = 0) -> None:
    """Refuse a parsed form or JSON body holding text, numbers or nesting the console
    cannot store or show."""
    if isinstance(value, str):
        clean(value, what, limit=64 * 1024, controls=True)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > MAX_INT:
            raise Problem(400, f"{what} is too large a number")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise Problem(400, f"{what} must be a finite number")
    elif isinstance(value, dict | list):
        if depth >= MAX_DEPTH:
            raise Problem(400, f"{what} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            for k, v in value.items():
                clean(k, f"a key of {what}", limit=MAX_PARAM)
                check_body(v, k if depth == 0 and k.isidentifier() else what, depth + 1)
        else:
            for v in value:
                check_body(v, what, depth + 1)
    else:
        raise Problem(400, f"{what} has a value of an unknown type")
