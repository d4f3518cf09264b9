"""Reading a console request: the bounded form or JSON body, typed fields, the edit and
the bulk filter it carries (bad input raises :class:`~replay_console.problem.Problem`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from postbacks.cli_args import MAX_NOTE
from postbacks.core.override import Override, OverrideError, parse_override
from replay_console import queries as q
from replay_console.guard import check_body, json_text
from replay_console.problem import Problem

__all__ = [
    "MAX_BODY",
    "body_of",
    "filter_from",
    "flag",
    "id_list",
    "is_api",
    "note_of",
    "override_from",
    "text",
    "whole",
]

BODY = web.RequestKey("body", dict)
MAX_BODY = 64 * 1024  # forms and JSON bodies; an edit is far smaller
# A body not all received in this long is refused (408): a client trickling a byte at a time
# would otherwise hold its connection (and, by the thousand, the descriptors the pool and
# the drainer need) for as long as it likes; keep-alive timeouts do not run during a read.
BODY_READ_S = 10.0


def is_api(request: web.Request) -> bool:
    return request.path.startswith("/api/")


async def body_of(request: web.Request) -> dict[str, Any]:
    """The request's form or JSON body as a dict (bounded; parsed once per request)."""
    if BODY in request:
        cached: dict[str, Any] = request[BODY]
        return cached
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise Problem(413, f"request body larger than {MAX_BODY} bytes")
    try:
        raw = await asyncio.wait_for(request.read(), BODY_READ_S)
    except web.HTTPRequestEntityTooLarge as exc:
        raise Problem(413, f"request body larger than {MAX_BODY} bytes") from exc
    except TimeoutError:
        raise Problem(408, f"the request body did not arrive within {BODY_READ_S:.0f} s"
                      ) from None
    except ConnectionError:  # the client went away mid-body: nobody reads an answer
        raise Problem(400, "the request body ended early (connection lost)") from None
    out = _parse_body(request, raw)

    check_body(out)  # the one check of every value a handler reads from a body
    request[BODY] = out
    return out


MAX_FIELDS = 1000


def _parse_body(request: web.Request, raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    if request.content_type == "application/json":
        try:
            data = json.loads(raw)
        except ValueError as exc:  # incl. invalid UTF-8 and over-long integers
            raise Problem(400, f"body is not JSON: {str(exc)[:200]}") from exc
        except RecursionError:
            raise Problem(400, "body is nested too deeply") from None
        if not isinstance(data, dict):
            raise Problem(400, "body must be a JSON object")
        return data
    from urllib.parse import parse_qs

    try:
        form = parse_qs(raw.decode(), keep_blank_values=True, strict_parsing=False,
                        errors="strict", max_num_fields=MAX_FIELDS)
    except UnicodeDecodeError as exc:
        raise Problem(400, "form is not UTF-8") from exc
    except ValueError as exc:
        raise Problem(400, f"form has more than {MAX_FIELDS} fields") from exc
    return {k: (v if len(v) > 1 else v[0]) for k, v in form.items()}


def note_of(body: Mapping[str, Any], key: str = "note") -> str | None:
    """An audited note or reason, at most ``MAX_NOTE`` characters: a bulk action copies
    it into each of its audit rows (and a held one into each outcome's reason)."""
    v = text(body, key)
    if v is not None and len(v) > MAX_NOTE:
        raise Problem(400, f"{key} is {len(v):,} characters long; at most {MAX_NOTE:,}")
    return v


def text(body: Mapping[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, list):
        raise Problem(400, f"{key} given more than once")
    if not isinstance(v, str | int):
        raise Problem(400, f"{key} must be a string")
    text = str(v).strip()
    return text or None


def flag(body: Mapping[str, Any], key: str) -> bool:
    """A checkbox or a JSON boolean."""
    v = body.get(key)
    if isinstance(v, bool):
        return v
    return isinstance(v, str | int) and str(v).strip().lower() in ("1", "true", "on", "yes")


def id_list(body: Mapping[str, Any], key: str) -> list[str]:
    v = body.get(key)
    if v is None:
        return []
    items = v if isinstance(v, list) else str(v).replace(",", " ").split()
    out = [str(i).strip() for i in items if str(i).strip()]
    if len(out) > 10_000:
        raise Problem(400, f"{key}: at most 10000 ids")
    return out


def whole(body: Mapping[str, Any], key: str, digits: int = 12) -> int | None:
    v = text(body, key)
    if v is None:
        return None
    if not (v.isascii() and v.isdigit()) or len(v) > digits:
        raise Problem(400, f"{key} must be a whole number")
    return int(v)


def override_from(body: Mapping[str, Any]) -> Override | None:
    """An edit from a JSON ``override`` object or the form's url/fields/aliases fields."""
    try:
        if isinstance(body.get("override"), dict):
            return parse_override(body["override"])
        raw: dict[str, Any] = {}
        url = text(body, "url")
        if url:
            raw["url"] = url
        fields = text(body, "fields")
        if fields:
            raw["fields"] = [f.strip() for f in fields.split(",") if f.strip()]
        aliases = text(body, "aliases")
        if aliases:
            raw["aliases"] = json_text(aliases, "aliases")
        return parse_override(raw) if raw else None
    except OverrideError as exc:
        raise Problem(400, str(exc)) from exc


def filter_from(body: Mapping[str, Any]) -> q.DeliveryFilter:
    raw = body.get("filter") if isinstance(body.get("filter"), dict) else {
        k: v for k, v in body.items() if k in ("q", "app", "endpoint", "status", "error",
                                               "error_class", "since", "until",
                                               "created_from", "created_to")}
    if not isinstance(raw, dict):
        raise Problem(400, "filter must be an object")
    params = {str(k): str(v) for k, v in raw.items() if v not in (None, "")}
    paging = sorted(set(params) & {"cursor", "limit"})
    if paging:  # (a page of a list: they select nothing, and "limit" did not limit it)
        raise Problem(400, f"a bulk replay selects by its filter alone; {' and '.join(paging)} "
                      "page a list and select nothing: leave them out")
    if not params:
        raise Problem(400, "a bulk replay needs at least one filter (q, app, endpoint, "
                      "status, error, since, until)")
    return q.parse_filter(params)
