"""Redaction of what the attempt log stores: configured PII fields in the body and query.

The exact bytes are signed and sent; only the stored copy is masked. Signature headers are
masked by :mod:`postbacks.core.outcomes`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from postbacks.core.render import RenderedRequest

__all__ = ["MASK", "redact_request"]

MASK = "[redacted]"


def _walk(value: Any, fields: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: (MASK if k in fields else _walk(v, fields)) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, fields) for v in value]
    return value


def _query(q: str, fields: frozenset[str]) -> str:
    pairs = parse_qsl(q, keep_blank_values=True)
    return urlencode([(k, MASK if k in fields else v) for k, v in pairs])


def redact_request(req: RenderedRequest, fields: tuple[str, ...]) -> RenderedRequest:
    if not fields:
        return req
    names = frozenset(fields)
    parts = urlsplit(req.url)
    url = urlunsplit(parts._replace(query=_query(parts.query, names))) if parts.query else req.url
    body = req.body
    ctype = req.headers.get("content-type", "")
    if body and "json" in ctype:
        try:
            body = orjson.dumps(_walk(orjson.loads(body), names))
        except orjson.JSONDecodeError:
            body = b"[unparseable body redacted]"
    elif body and "x-www-form-urlencoded" in ctype:
        body = _query(body.decode("utf-8", "replace"), names).encode()
    return RenderedRequest(req.method, url, dict(req.headers), body)
