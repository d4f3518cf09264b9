"""Sending one rendered request, with the SSRF guard before connect and in the resolver.

The wire is :mod:`postbacks.transport.h1`, a small HTTP/1.1 client on an asyncio Protocol
with the llhttp parser (httptools), chosen by measurement on the whole pipeline
(docs/decisions/0001-http-client.md); ``client="aiohttp"`` or ``"httpx"`` sends through
that library instead (:mod:`postbacks.transport.wire`).

Two guards, both before any socket is opened:

* every URL (the first and each redirect hop) passes :func:`url_blocked_reason`, and the
  host as yarl parsed it passes :func:`host_blocked_reason`. IP literals in every form
  (``2130706433``, ``0177.0.0.1``, ``[::ffff:7f00:1]``) are judged here and connected to
  without asking DNS;
* every hostname is resolved by :class:`VettingResolver` (``loop.getaddrinfo``, results
  cached for 30 s), which drops any address the SSRF policy refuses. The client then
  connects to a vetted *address* (the first; the next only if connecting fails, or if
  the connect is not answered within ``CONNECT_EACH_S`` while another address is left),
  with the URL's host as TLS ``server_hostname`` and ``Host``, so there is no window for
  DNS rebinding between check and connect.

Redirects are never followed by the client. With ``follow_redirects=True`` this module
follows 301/302/303/307/308 up to ``max_redirects`` hops, each hop re-checked by both
guards and by :func:`redirect_refused_reason` (no https -> http). Errors become::

    refused before connect  -> HttpResult(None, "blocked_address"), blocked=<reason>
    URL yarl cannot parse   -> HttpResult(None, "invalid_url"),     blocked=<reason>
    resolver refused all    -> HttpResult(None, "blocked_address"), blocked=<reason>
    request text malformed  -> HttpResult(None, "invalid_request"), blocked=<reason>
    timeout                 -> HttpResult(None, "timeout")
    other connect/IO error  -> HttpResult(None, "connection_error")
    a response              -> HttpResult(status, None, retry_after)
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import email.utils
import functools
import re
import time
from dataclasses import dataclass
from typing import Any

from yarl import URL

from postbacks.core.classify import HttpResult
from postbacks.core.providers import get_provider, provider_names
from postbacks.core.render import MAX_URL_BYTES, RenderedRequest
from postbacks.core.ssrf import (
    ALLOWED_SCHEMES,
    REDIRECT_STATUSES,
    host_blocked_reason,
    redirect_method,
    redirect_refused_reason,
    url_blocked_reason,
)
from postbacks.core.targets import as_sent
from postbacks.transport.clients import open_wire
from postbacks.transport.deadlines import Deadlines
from postbacks.transport.h1 import (
    BODY_LIMIT,
    ConnectError,
    H1Response,
    InvalidRequest,
    PoolKey,
)
from postbacks.transport.resolver import BlockedAddress, Lookup, VettingResolver
from postbacks.transport.wire import Wire

__all__ = ["BODY_BYTES", "EXCERPT_BYTES", "BlockedAddress", "HttpTransport", "SendResult",
           "VettingResolver"]

EXCERPT_BYTES = 256
BODY_BYTES = BODY_LIMIT  # 64 KiB

IDLE_TIMEOUT_S = 30.0
# How long a connect may go unanswered while the name has another address to try: an
# address that drops connection attempts silently (a dead host, a broken IPv6 route) would
# otherwise spend the whole timeout, every attempt, with a working address unused.
CONNECT_EACH_S = 2.0
# An address that failed to connect is tried after its name's other addresses for this
# long, so the sends that follow do not each wait CONNECT_EACH_S on it first.
CONNECT_FAILED_S = 60.0
_CONNECT_FAILED_MAX = 4096  # addresses remembered (expired ones pruned past it)

# Dropped when a hop changes origin (as browsers do) or switches to a body-less GET.
# A redirect to another origin carries only the headers a provider sets itself (identity,
# signatures, content type): the endpoint's own custom headers (an API key) and any
# credential stay with the origin they were for.
_CROSS_ORIGIN_KEPT = frozenset({"user-agent"}).union(
    *(get_provider(name).reserved_headers for name in provider_names()))
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding"})


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one send produced. ``excerpt`` is the first 256 bytes of the final response
    body, ``body`` the first 64 KiB; ``blocked`` says why the request was refused unsent."""

    http: HttpResult
    wire_ms: float
    excerpt: bytes | None
    blocked: str | None = None
    body: bytes | None = None
    # how long the send waited for one of the client's ``limit`` requests in flight: the
    # other endpoints' time, not this receiver's (left out of its lane's pace)
    queued_s: float = 0.0


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


_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After (RFC 9110 10.2.3) in seconds from ``now``: delay-seconds (digits only),
    or an HTTP-date (one already past is 0). Anything else is absent (the schedule
    applies); the caller clamps the range."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):  # (a fraction is not in the RFC; taken all the same)
        digits = value.lstrip("0") or "0"
        return float(digits) if len(digits) < 16 else 1e15  # past any clamp
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # (an HTTP-date is GMT; "-0000" parses naive)
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


# Vetting parses the URL (yarl, IDNA) and judges its host: cached for the URLs an endpoint
# sends to again and again (a POST's fixed URL), up to a size that keeps the cache's memory
# small whatever a receiver's redirects or a template's values make of a URL.
_VET_CACHED_CHARS = 2048


def _vet(url: str, *, allow_loopback: bool) -> URL | _Refused:
    """The URL to request, or why it must not be requested."""
    if len(url) > MAX_URL_BYTES:
        return _Refused("invalid_url", f"invalid_url: {len(url):,} characters, over the "
                                       f"{MAX_URL_BYTES:,} a postback URL may have")
    if len(url) > _VET_CACHED_CHARS:
        return _vet_url(url, allow_loopback=allow_loopback)
    return _vet_cached(url, allow_loopback=allow_loopback)


def _vet_url(url: str, *, allow_loopback: bool) -> URL | _Refused:
    try:
        target = as_sent(url)  # sent byte for byte when already encoded (v2 signs it)
        # Decoded lazily, and encoded again by the resolver: a name IDNA refuses (an empty
        # label, one over 63 characters, a bad xn-- label) is refused here, not mid-send.
        host = target.host
        if target.raw_host:
            target.raw_host.encode("idna")
    except Exception as exc:  # UnicodeError is a ValueError; yarl raised IndexError on some
        return _Refused("invalid_url", f"invalid_url: {exc}")
    reason = url_blocked_reason(url, allow_loopback=allow_loopback)
    if reason is not None:
        return _Refused("blocked_address", reason)
    if target.scheme not in ALLOWED_SCHEMES or not host:
        return _Refused("invalid_url", f"invalid_url: {url!r}")
    if target.user is not None or target.password is not None:
        return _Refused("blocked_address", "userinfo in URL not allowed")
    # The host exactly as it will be resolved (yarl applies IDNA, e.g. full-width digits).
    reason = host_blocked_reason(host, allow_loopback=allow_loopback)
    if reason is not None:
        return _Refused("blocked_address", reason)
    return target


_vet_cached = functools.lru_cache(maxsize=4096)(_vet_url)


def _origin(u: URL) -> tuple[str, str | None, int | None]:
    return u.scheme, u.host, u.port


class HttpTransport:
    """Sends rendered requests; use as ``async with HttpTransport(...) as t``.

    ``limit`` bounds the requests in flight and the connections per (address, port,
    TLS name); idle keep-alive connections are closed after 30 s. ``client`` names the
    wire (``h1``, ``aiohttp``, ``httpx``; :mod:`postbacks.transport.wire`).

    Each send (resolve, connect, write, read; every redirect hop when following them) ends
    with ``timeout`` at ``timeout_s``, up to one tick later (``min(50 ms, timeout_s / 10)``), by
    :class:`~postbacks.transport.deadlines.Deadlines` (a sweep instead of an
    ``asyncio.timeout`` per request: ~1 against ~12 µs of CPU on a slow host). A task
    cancelled by someone else at the same time stays cancelled.
    """

    def __init__(self, *, timeout_s: float, allow_loopback: bool, limit: int = 512,
                 lookup: Lookup | None = None, client: str = "h1") -> None:
        self._timeout_s = timeout_s
        self._allow_loopback = allow_loopback
        self._limit = limit
        self._inflight = asyncio.Semaphore(limit)
        self._client = client
        self._resolver = VettingResolver(allow_loopback, lookup=lookup)
        self._pool: Wire | None = None
        self._deadlines = Deadlines(timeout_s)
        self._failed: dict[tuple[str, int], float] = {}  # (address, port) -> tried last until

    async def __aenter__(self) -> HttpTransport:
        self._pool = open_wire(self._client, limit=self._limit, idle_timeout_s=IDLE_TIMEOUT_S)
        self._inflight = asyncio.Semaphore(self._limit)  # bound to this loop on first use
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._deadlines.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def send(
        self, req: RenderedRequest, *, follow_redirects: bool = False, max_redirects: int = 3
    ) -> SendResult:
        """Send ``req``; a 3xx is returned as-is unless ``follow_redirects``.

        A redirect chain longer than ``max_redirects`` ends with the last 3xx response
        (which classifies as permanent). One deadline covers the whole chain: a receiver
        answering each hop just inside the timeout cannot stretch the send to hops x it.
        """
        # Waiting for one of the ``limit`` requests in flight is not the receiver's time:
        # the deadline starts once this send holds one. Otherwise endpoints that hang, with
        # enough lanes to fill the limit, would time out every other endpoint's sends and
        # open their breakers.
        asked = time.perf_counter()
        async with self._inflight:
            start = time.perf_counter()
            task = asyncio.current_task()
            assert task is not None
            deadline = self._deadlines.arm(task)
            try:
                result = await self._send(req, follow_redirects, max_redirects, start)
            except asyncio.CancelledError:
                if not self._deadlines.timed_out(deadline):
                    raise  # the caller cancelled (too)
                result = SendResult(HttpResult(None, "timeout"), _ms(start), None)
            finally:
                self._deadlines.disarm(deadline)
        if start - asked > 0.001:  # (the common case: a slot at once, the result as it is)
            result = dataclasses.replace(result, queued_s=start - asked)
        return result

    async def _send(self, req: RenderedRequest, follow_redirects: bool, max_redirects: int,
                    start: float) -> SendResult:
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
                               if k.lower() in _CROSS_ORIGIN_KEPT}
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
            except Exception as exc:  # the receiver's text: yarl raised IndexError on some
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
        """One request on the wire, errors translated (wire_ms left to the caller); the
        deadline is the caller's (:meth:`send`)."""
        pool = self._pool
        assert pool is not None, "use `async with HttpTransport(...)`"
        host = target.raw_host
        assert host is not None  # _vet refused host-less URLs
        port = target.port or (443 if target.scheme == "https" else 80)
        tls_name = host.rstrip(".") if target.scheme == "https" else None
        try:
            addresses = await self._resolver.resolve(host)
            if len(addresses) > 1 and self._failed:
                addresses = self._ordered(addresses, port)
            last = len(addresses) - 1
            # every address but the last gets a share of the timeout to connect in
            each = min(CONNECT_EACH_S, self._timeout_s / len(addresses))
            for i, address in enumerate(addresses):
                try:
                    resp = await pool.request(
                        PoolKey(target.scheme, address, port, tls_name, host.rstrip(".")),
                        method,
                        target.raw_path_qs or "/", target.host_port_subcomponent or host,
                        headers, body, connect_timeout_s=each if i < last else None,
                    )
                    break
                except ConnectError:
                    if last:
                        self._failing((address, port))
                    if i == last:
                        raise
            if last and (address, port) in self._failed:
                del self._failed[address, port]
        except BlockedAddress as exc:
            return SendResult(HttpResult(None, "blocked_address"), 0.0, None, str(exc))
        except InvalidRequest as exc:
            return SendResult(HttpResult(None, "invalid_request"), 0.0, None, str(exc))
        except UnicodeError as exc:  # a host name the resolver cannot encode
            return SendResult(HttpResult(None, "invalid_url"), 0.0, None, f"invalid_url: {exc}")
        except TimeoutError:
            return SendResult(HttpResult(None, "timeout"), 0.0, None)
        except OSError:
            return SendResult(HttpResult(None, "connection_error"), 0.0, None)
        return _reply(resp)

    def _ordered(self, addresses: tuple[str, ...], port: int) -> tuple[str, ...]:
        """``addresses`` with those that failed to connect on ``port`` lately moved to the
        end."""
        now = time.monotonic()
        failed = self._failed
        late = [a for a in addresses if failed.get((a, port), 0.0) > now]
        if not late:
            return addresses
        return tuple(a for a in addresses if a not in late) + tuple(late)

    def _failing(self, address: tuple[str, int]) -> None:
        failed = self._failed
        now = time.monotonic()
        if len(failed) >= _CONNECT_FAILED_MAX:
            for a in [a for a, until in failed.items() if until <= now]:
                del failed[a]
            if len(failed) >= _CONNECT_FAILED_MAX:
                failed.clear()
        failed[address] = now + CONNECT_FAILED_S


def _reply(resp: H1Response) -> _Reply:
    h = resp.headers
    return _Reply(resp.status, h.get("location"), _retry_after(h.get("retry-after")), resp.body)


def _refused(refusal: _Refused, start: float) -> SendResult:
    return SendResult(HttpResult(None, refusal.error_class), _ms(start), None, refusal.reason)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
