"""Redaction of what the attempt log stores: configured PII fields in the body and query,
and the values of the endpoint's own custom headers (an API key, a partner token: shown
only to admins, on the endpoint's page).

The exact bytes are signed and sent; only the stored copy is masked. Signature headers are
masked by :mod:`postbacks.core.outcomes`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from postbacks.core.render import RenderedRequest

__all__ = ["ECHO_MIN", "MASK", "NO_REDACTION", "Redaction", "field_names", "redact_request"]

MASK = "[redacted]"
ECHO_MIN = 6  # a custom header value this long or longer is masked where it is echoed


@dataclass(frozen=True, slots=True)
class Redaction:
    """What the stored copy of a request masks: ``fields`` (names in a JSON or form body
    and in the query) and the values of ``headers`` (lower-case names). Where a receiver
    echoes one in its response (:meth:`scrub`), ``secrets`` (the header values, 6
    characters or more) are masked wherever they appear, and ``words`` (the values the
    fields had in the request, from :meth:`echoing`) where they stand as a word of their
    own: an address field's "Cupertino" is not masked inside "Cupertinos", nor a
    ``123456`` inside a longer number."""

    fields: tuple[str, ...] = ()
    headers: frozenset[str] = frozenset()
    secrets: tuple[bytes, ...] = ()
    words: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, fields: Iterable[str], headers: Mapping[str, str]) -> Redaction:
        secrets = _echoes(headers.values(), credentials=True)
        return cls(tuple(fields), frozenset(h.lower() for h in headers), secrets)

    def echoing(self, req: RenderedRequest) -> Redaction:
        """This redaction, also masking the values its ``fields`` have in ``req`` where a
        receiver echoes them in its response (an e-mail address sent in a masked field)."""
        if not self.fields:
            return self
        values = _field_values(req, frozenset(self.fields))
        if not values:
            return self
        return Redaction(self.fields, self.headers, self.secrets, _echoes(values))

    def scrub_text(self, text: str) -> str:
        """``text`` (a reason built from a response: a validator's) with every secret in it
        masked."""
        if not text or not (self.secrets or self.words):
            return text
        return (self.scrub(text.encode()) or b"").decode("utf-8", "replace")

    def scrub(self, body: bytes | None) -> bytes | None:
        """``body`` (a response excerpt) with every secret value in it masked."""
        if not body or not (self.secrets or self.words):
            return body
        for value in self.secrets:
            body = body.replace(value, MASK.encode())
        for word in self.words:
            body = re.sub(rb"(?<![A-Za-z0-9])" + re.escape(word) + rb"(?![A-Za-z0-9])",
                          MASK.encode(), body)
        return body

    def excerpt(self, body: bytes | None, limit: int) -> bytes | None:
        """The first ``limit`` bytes of ``body`` masked: masked first, then cut (a secret
        straddling the cut used to keep its first part)."""
        if body is None:
            return None
        longest = max((len(v) for v in (*self.secrets, *self.words)), default=0)
        scrubbed = self.scrub(body[:limit + longest])
        return None if scrubbed is None else scrubbed[:limit]


NO_REDACTION = Redaction()


_CREDENTIAL = re.compile(r"(?i)(?:bearer|basic|token|apikey|api-key|digest)\s+(\S+)")


def _echoes(values: Iterable[str], *, credentials: bool = False) -> tuple[bytes, ...]:
    """The values (6 characters or more) as a response may echo them: as sent, with
    ``credentials`` the credential alone of ``Bearer <token>`` (Basic, Token, ...), and
    each with ``/`` escaped as JSON encoders such as PHP's write it; longest first."""
    found: set[bytes] = set()
    for value in values:
        alone = _CREDENTIAL.fullmatch(value.strip()) if credentials else None
        for v in {value, alone.group(1) if alone else value}:
            if len(v) >= ECHO_MIN:
                found.add(v.encode())
                if "/" in v:
                    found.add(v.replace("/", "\\/").encode())
    return tuple(sorted(found, key=len, reverse=True))


def _field_values(req: RenderedRequest, fields: frozenset[str]) -> list[str]:
    """The values of ``fields`` in ``req``'s query and JSON (any depth) or form body."""
    pairs = parse_qsl(urlsplit(req.url).query, keep_blank_values=True)
    ctype = req.headers.get("content-type", "")
    if req.body and "x-www-form-urlencoded" in ctype:
        pairs += parse_qsl(req.body.decode("utf-8", "replace"), keep_blank_values=True)
    out = [v for k, v in pairs if k in fields]
    if req.body and "json" in ctype:
        with contextlib.suppress(orjson.JSONDecodeError):
            _values(orjson.loads(req.body), fields, out, False)
    return out


def _values(value: Any, fields: frozenset[str], into: list[str], masked: bool) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _values(v, fields, into, masked or k in fields)
    elif isinstance(value, list):
        for v in value:
            _values(v, fields, into, masked)
    elif masked and isinstance(value, str | int | float) and not isinstance(value, bool):
        into.append(str(value))


def _walk(value: Any, fields: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {k: (MASK if k in fields else _walk(v, fields)) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, fields) for v in value]
    return value


def _query(q: str, fields: frozenset[str]) -> str:
    pairs = parse_qsl(q, keep_blank_values=True)
    return urlencode([(k, MASK if k in fields else v) for k, v in pairs])


def _keys(value: Any, into: set[str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            into.add(k)
            _keys(v, into)
    elif isinstance(value, list):
        for v in value:
            _keys(v, into)


def field_names(req: RenderedRequest) -> set[str]:
    """The names ``redact_fields`` can mask in ``req``: its query's, and its JSON (at any
    depth) or form body's."""
    names = {k for k, _v in parse_qsl(urlsplit(req.url).query, keep_blank_values=True)}
    ctype = req.headers.get("content-type", "")
    if req.body and "json" in ctype:
        with contextlib.suppress(orjson.JSONDecodeError):
            _keys(orjson.loads(req.body), names)
    elif req.body and "x-www-form-urlencoded" in ctype:
        names |= {k for k, _v in parse_qsl(req.body.decode("utf-8", "replace"),
                                           keep_blank_values=True)}
    return names


def redact_request(req: RenderedRequest,
                   redaction: Redaction | tuple[str, ...]) -> RenderedRequest:
    r = redaction if isinstance(redaction, Redaction) else Redaction(redaction)
    if not r.fields and not r.headers:
        return req
    headers = {k: (MASK if k.lower() in r.headers else v) for k, v in req.headers.items()}
    if not r.fields:
        return RenderedRequest(req.method, req.url, headers, req.body)
    names = frozenset(r.fields)
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
    return RenderedRequest(req.method, url, headers, body)
