"""Sending one rendered request, with the SSRF guard before connect and in the resolver.

aiohttp was chosen by measurement (see README "Performance"): on this class of machine it
sustains ~9,000 keep-alive POST/s per core where httpx's AsyncClient managed ~700.

Two guards, both before any socket is opened:

* every URL (the first and each redirect hop) passes :func:`url_blocked_reason`, and the
  host as yarl parsed it passes :func:`host_blocked_reason`. aiohttp connects to anything
  that looks numeric (``2130706433``, ``0177.0.0.1``, ``[::ffff:7f00:1]``) without asking
  the resolver, so IP literals in every form are judged here;
* the connector resolves every hostname through :class:`VettingResolver`, which drops any
  address the SSRF policy refuses; aiohttp then connects to exactly the vetted addresses it
  was handed, so there is no window for DNS rebinding between check and connect.

aiohttp never follows redirects itself. With ``follow_redirects=True`` this module follows
301/302/303/307/308 up to ``max_redirects`` hops, each hop re-checked by both guards and
by :func:`redirect_refused_reason` (no https -> http). aiohttp's exceptions are translated
to :class:`HttpResult` here::

    refused before connect  -> HttpResult(None, "blocked_address"), blocked=<reason>
    URL yarl cannot parse   -> HttpResult(None, "invalid_url"),     blocked=<reason>
    resolver refused all    -> HttpResult(None, "blocked_address"), blocked=<reason>
    timeout                 -> HttpResult(None, "timeout")
    other connect/IO error  -> HttpResult(None, "connection_error")
    a response              -> HttpResult(status, None, retry_after)
"""

from __future__ import annotations

import functools
import socket
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from postbacks.core.classify import HttpResult
from postbacks.core.render import RenderedRequest
from postbacks.core.ssrf import (
    ALLOWED_SCHEMES,
    REDIRECT_STATUSES,
    blocked_reason,
    host_blocked_reason,
    redirect_method,
    redirect_refused_reason,
    url_blocked_reason,
)

__all__ = ["BODY_BYTES", "EXCERPT_BYTES", "BlockedAddress", "HttpTransport", "SendResult",
           "VettingResolver"]

EXCERPT_BYTES = 256
BODY_BYTES = 64 * 1024

# Dropped when a hop changes origin (as browsers do) or switches to a body-less GET.
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding"})


class BlockedAddress(OSError):
    """Every address of the host is refused by the SSRF policy."""


class VettingResolver(AbstractResolver):
    def __init__(self, allow_loopback: bool) -> None:
        self._inner = DefaultResolver()
        self._allow_loopback = allow_loopback

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        vetted = [
            r for r in results
            if blocked_reason(r["host"], allow_loopback=self._allow_loopback) is None
        ]
        if not vetted:
            reasons = {blocked_reason(r["host"], allow_loopback=self._allow_loopback)
                       for r in results}
            raise BlockedAddress(f"{host}: refused ({', '.join(sorted(map(str, reasons)))})")
        return vetted

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one send produced. ``excerpt`` is the first 256 bytes of the final response
    body, ``body`` the first 64 KiB; ``blocked`` says why the request was refused unsent."""

    http: HttpResult
    wire_ms: float
    excerpt: bytes | None
    blocked: str | None = None
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class _Refused:
    error_class: str
    reason: str


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    location: str | None
    retry_after: float | None
    body: bytes


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # HTTP-date form: treated as absent (the schedule applies)


@functools.lru_cache(maxsize=8192)
def _vet(url: str, *, allow_loopback: bool) -> URL | _Refused:
    """The URL aiohttp will be handed, or why it must not be requested."""
    try:
        target = URL(url)
    except (ValueError, TypeError) as exc:
        return _Refused("invalid_url", f"invalid_url: {exc}")
    reason = url_blocked_reason(url, allow_loopback=allow_loopback)
    if reason is not None:
        return _Refused("blocked_address", reason)
    if target.scheme not in ALLOWED_SCHEMES or not target.host:
        return _Refused("invalid_url", f"invalid_url: {url!r}")
    if target.user is not None or target.password is not None:
        return _Refused("blocked_address", "userinfo in URL not allowed")
    # The host exactly as aiohttp will see it (yarl applies IDNA, e.g. full-width digits).
    reason = host_blocked_reason(target.host, allow_loopback=allow_loopback)
    if reason is not None:
        return _Refused("blocked_address", reason)
    return target


def _origin(u: URL) -> tuple[str, str | None, int | None]:
    return u.scheme, u.host, u.port


async def _read_body(resp: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    remaining = BODY_BYTES
    while remaining > 0:
        chunk = await resp.content.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class HttpTransport:
    def __init__(self, *, timeout_s: float, allow_loopback: bool, limit: int = 512) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._allow_loopback = allow_loopback
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpTransport:
        connector = aiohttp.TCPConnector(
            limit=self._limit, limit_per_host=0, ttl_dns_cache=30,
            resolver=VettingResolver(self._allow_loopback),
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent",), trust_env=False,
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(
        self, req: RenderedRequest, *, follow_redirects: bool = False, max_redirects: int = 3
    ) -> SendResult:
        """Send ``req``; a 3xx is returned as-is unless ``follow_redirects``.

        A redirect chain longer than ``max_redirects`` ends with the last 3xx response
        (which classifies as permanent).
        """
        start = time.perf_counter()
        method, url, headers = req.method, req.url, dict(req.headers)
        body: bytes | None = req.body
        previous: URL | None = None
        hops = 0
        while True:
            target = _vet(url, allow_loopback=self._allow_loopback)
            if isinstance(target, _Refused):
                return _refused(target, start)
            if previous is not None:
                reason = redirect_refused_reason(str(previous), str(target))
                if reason is not None:
                    return _refused(_Refused("blocked_address", reason), start)
                if _origin(previous) != _origin(target):
                    headers = {k: v for k, v in headers.items()
                               if k.lower() not in _CREDENTIAL_HEADERS}
            reply = await self._exchange(method, target, headers, body)
            if isinstance(reply, SendResult):
                return SendResult(reply.http, _ms(start), None, reply.blocked)
            if (not follow_redirects or reply.status not in REDIRECT_STATUSES
                    or reply.location is None or hops >= max_redirects):
                return SendResult(
                    HttpResult(reply.status, None, reply.retry_after), _ms(start),
                    reply.body[:EXCERPT_BYTES], None, reply.body,
                )
            try:
                url = str(target.join(URL(reply.location)))
            except (ValueError, TypeError) as exc:
                return _refused(_Refused("invalid_url", f"invalid_url: Location: {exc}"), start)
            method, keep_body = redirect_method(reply.status, method)
            if not keep_body:
                body = None
                headers = {k: v for k, v in headers.items() if k.lower() not in _BODY_HEADERS}
            previous = target
            hops += 1

    async def _exchange(
        self, method: str, target: URL, headers: dict[str, str], body: bytes | None
    ) -> _Reply | SendResult:
        """One request on the wire, aiohttp's exceptions translated (wire_ms left to caller)."""
        assert self._session is not None, "use `async with HttpTransport(...)`"
        try:
            async with self._session.request(
                method, target, data=body, headers=headers, allow_redirects=False
            ) as resp:
                return _Reply(
                    resp.status, resp.headers.get("Location"),
                    _retry_after(resp.headers.get("Retry-After")), await _read_body(resp),
                )
        except BlockedAddress as exc:
            return SendResult(HttpResult(None, "blocked_address"), 0.0, None, str(exc))
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, BlockedAddress):
                return SendResult(
                    HttpResult(None, "blocked_address"), 0.0, None, str(exc.os_error)
                )
            return SendResult(HttpResult(None, "connection_error"), 0.0, None)
        except aiohttp.InvalidURL as exc:
            return SendResult(HttpResult(None, "invalid_url"), 0.0, None, f"invalid_url: {exc}")
        except TimeoutError:
            return SendResult(HttpResult(None, "timeout"), 0.0, None)
        except (aiohttp.ClientError, OSError):
            return SendResult(HttpResult(None, "connection_error"), 0.0, None)


def _refused(refusal: _Refused, start: float) -> SendResult:
    return SendResult(HttpResult(None, refusal.error_class), _ms(start), None, refusal.reason)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
