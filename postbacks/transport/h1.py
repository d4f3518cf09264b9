"""A minimal, fast HTTP/1.1 client for the delivery hot path (asyncio Protocol + httptools).

Why not aiohttp's ClientSession or httpx's AsyncClient: measured as the agent's wire on the
whole pipeline, they reach 0.64 and 0.02 of this client's rate
(docs/decisions/0001-http-client.md). This client does only what a postback needs:

* one ``transport.write`` per request (request line, headers, body);
* the response parsed by llhttp (``httptools.HttpResponseParser``, C): status, the few
  headers asked for (``Retry-After``, ``Location``), body framing by Content-Length,
  chunked or end-of-connection, 1xx interim responses skipped, 204/304 without a body;
* the first ``body_limit`` (64 KiB) body bytes kept; the rest read and discarded, or, past
  ``discard_limit`` (1 MiB), the connection closed (the response still counts);
* a keep-alive pool per :class:`PoolKey` ``(scheme, ip, port, server_hostname, host)``
  (per origin, also over plain http, and per address): the caller
  connects to an address it has already vetted, never to a name (no DNS here at all);
  at most ``max_per_key`` connections per key (further requests wait for one), at most
  ``max_total`` requests in flight, idle connections closed after ``idle_timeout_s``.
  A connection goes back to the pool only once its response was read to the end, the
  server did not ask to close it and nothing is left unwritten; anything else closes it.
  Bytes arriving on an idle connection close it too, and before it carries the next
  request the socket is checked for unread ones (``_Conn.quiet``): a receiver answering
  twice must not have its second answer taken for the next request's;
* TLS through ``loop.create_connection(ssl=..., server_hostname=...)`` with the default
  (verifying) context;
* a total timeout per request via ``asyncio.timeout`` (connect + write + read).

Stale keep-alive connections: a server may close an idle connection just as a request is
written on it. Before an idle connection carries a request, its socket is polled: a close
from the server already received (or any unread byte) sends the request on a fresh
connection instead. A written request is never sent again here, whatever the failure:
the server may have acted on it, and every request that goes out must be the caller's to
record (the agent's attempt log has one attempt per request). A request written just as
the server closes, unanswered, is a :class:`ServerDisconnected` like any other, which the
agent records and retries.

Errors are ``OSError`` subclasses, so callers can map them in one place: :class:`ConnectError`
(could not connect, including TLS verification), :class:`ServerDisconnected` (closed before
the response was complete), :class:`ProtocolError` (malformed response), ``TimeoutError``
(from ``asyncio.timeout``). :class:`InvalidRequest` (a ``ValueError``) refuses request text
that could split the request (CR, LF or NUL in the target or a header).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import ssl

from postbacks.transport.h1_conn import (
    BODY_LIMIT,
    DISCARD_LIMIT,
    USER_AGENT,
    ConnectError,
    H1Response,
    InvalidRequest,
    PoolKey,
    ProtocolError,
    ServerDisconnected,
    _Conn,
    _Slot,
    encode_request,
)

__all__ = [
    "BODY_LIMIT",
    "DISCARD_LIMIT",
    "EARLY_REFUSALS",
    "USER_AGENT",
    "ConnectError",
    "H1Pool",
    "H1Response",
    "InvalidRequest",
    "PoolKey",
    "ProtocolError",
    "ServerDisconnected",
    "encode_request",
    "idle_limit_s",
]

TLS_SHUTDOWN_S = 2.0  # how long a closed TLS connection waits for the receiver's close
# Answers a receiver gives from a request's head, often before reading its body: after one
# to a request with a body, the connection is not reused. (Other statuses keep it: a
# receiver answering 404 or 500 has usually read the request, and a new connection per
# failed delivery would load a receiver already in trouble.)
EARLY_REFUSALS = frozenset({400, 401, 403, 405, 408, 411, 413, 414, 415, 417, 429, 431})
_KEEP_ALIVE_TIMEOUT = re.compile(r"(?:^|[,;\s])timeout\s*=\s*(\d{1,6})(?![\d.])", re.I)


def idle_limit_s(keep_alive: str | None) -> float:
    """How long a connection may sit idle and still carry a request, from the receiver's
    ``Keep-Alive: timeout=N`` (Node closes idle connections after 5 s, Apache after 5 s
    by default): a second short of it, or half of it under 2 s, so a request is not
    written just as the receiver closes. No such header: no limit but the pool's."""
    m = _KEEP_ALIVE_TIMEOUT.search(keep_alive or "")
    if m is None:
        return math.inf
    n = float(m.group(1))
    return max(n - 1.0, n / 2)


class H1Pool:
    """Keep-alive HTTP/1.1 connections per :class:`PoolKey`; see the module doc."""

    def __init__(
        self, *, max_per_key: int = 64, max_total: int = 512, max_idle: int | None = None,
        idle_timeout_s: float = 30.0, ssl_context: ssl.SSLContext | None = None,
        body_limit: int = BODY_LIMIT, discard_limit: int = DISCARD_LIMIT,
        user_agent: str = USER_AGENT,
        wanted_headers: tuple[str, ...] = ("retry-after", "location", "keep-alive"),
    ) -> None:
        if max_per_key < 1 or max_total < 1:
            raise ValueError("max_per_key and max_total must be >= 1")
        self.max_per_key = max_per_key
        self.max_idle = max_total if max_idle is None else max_idle
        self.idle_timeout_s = idle_timeout_s
        self.body_limit = body_limit
        self.discard_limit = max(discard_limit, body_limit)
        self.user_agent = user_agent
        self.wanted = frozenset(h.lower().encode("ascii") for h in wanted_headers)
        self.conns: set[_Conn] = set()
        self._ssl = ssl_context
        self._limit = asyncio.Semaphore(max_total)
        self._slots: dict[PoolKey, _Slot] = {}
        self._n_idle = 0
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def __aenter__(self) -> H1Pool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> dict[str, int]:
        """Open connections and idle ones (for tests and metrics)."""
        return {"open": len(self.conns), "idle": self._n_idle}

    async def request(
        self, key: PoolKey, method: str, target: str, host: str, headers: dict[str, str],
        body: bytes | None = None, *, timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
    ) -> H1Response:
        """Send one request on a pooled connection to ``key`` and read the response.

        ``target`` is the request target (path and query, already encoded), ``host`` the
        Host header value; a new connection not made within ``connect_timeout_s`` is a
        :class:`ConnectError`. Raises :class:`InvalidRequest`, ``TimeoutError`` or an
        ``OSError`` (:class:`ConnectError`, :class:`ServerDisconnected`, ...).
        """
        data = encode_request(method, target, host, headers, body, self.user_agent)
        head = method == "HEAD"
        if timeout_s is None:
            return await self._send(key, data, head, connect_timeout_s, bool(body))
        async with asyncio.timeout(timeout_s):
            return await self._send(key, data, head, connect_timeout_s, bool(body))

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for slot in self._slots.values():
            for w in slot.waiters:
                if not w.done():
                    w.set_exception(ConnectionError("connection pool closed"))
            slot.waiters.clear()
            slot.idle.clear()
        self._slots.clear()
        self._n_idle = 0
        for conn in list(self.conns):
            conn.shut()
        if self.conns:
            await asyncio.sleep(0)  # let connection_lost run

    # -- one exchange ----------------------------------------------------------------------

    async def _send(self, key: PoolKey, data: bytes, head: bool,
                    connect_s: float | None, with_body: bool) -> H1Response:
        if self._closed:
            raise ConnectionError("connection pool closed")
        async with self._limit:
            conn = await self._acquire(key, connect_s)  # checked quiet: not closed by the server
            try:
                resp = await conn.send(data, head)
            except BaseException:
                self._release(conn)
                raise
            conn.idle_limit_s = idle_limit_s(resp.headers.get("keep-alive"))
            if (with_body and resp.status in EARLY_REFUSALS) or conn.idle_limit_s <= 0:
                # A receiver refusing a request from its head alone often answers without
                # reading the body (a 401 from its auth layer): the unread body would then
                # be parsed as the next request on the connection, answered as garbage.
                conn.retire()
            self._release(conn)
            return resp

    # -- the pool --------------------------------------------------------------------------

    async def _acquire(self, key: PoolKey, connect_s: float | None) -> _Conn:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(key)
        idle = slot.idle
        while idle:
            conn = idle.pop()
            self._n_idle -= 1
            if conn.usable and conn.quiet and \
                    self.loop.time() - conn.idle_since < conn.idle_limit_s:
                return conn
            conn.shut()
            self._give_back(slot, forget=False)
        if slot.open < self.max_per_key:
            slot.open += 1
            return await self._open(key, slot, connect_s)
        waiter: asyncio.Future[_Conn | None] = self.loop.create_future()
        slot.waiters.append(waiter)
        try:
            handed = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                got = waiter.result()  # handed over just as we were cancelled: pass it on
                if got is None:
                    self._give_back(slot)
                else:
                    self._release(got)
            else:
                with contextlib.suppress(ValueError):
                    slot.waiters.remove(waiter)
            raise
        if handed is not None and handed.usable and handed.quiet:
            return handed
        if handed is not None:
            handed.shut()
        return await self._open(key, slot, connect_s)

    async def _open(self, key: PoolKey, slot: _Slot, connect_s: float | None) -> _Conn:
        """A new connection for ``slot``, whose count already includes it."""
        ctx: ssl.SSLContext | None = None
        if key.scheme == "https":
            ctx = self._ssl
            if ctx is None:
                ctx = self._ssl = ssl.create_default_context()
                ctx.set_alpn_protocols(["http/1.1"])
        made: list[_Conn] = []

        def factory() -> _Conn:
            made.append(_Conn(self, slot))
            return made[0]

        bound = asyncio.timeout(connect_s)
        try:
            async with bound:
                _, conn = await self.loop.create_connection(
                    factory, key.ip, key.port, ssl=ctx,
                    server_hostname=(key.server_hostname or key.ip) if ctx else None,
                    # a receiver that never answers our TLS close held the socket 30 s (the
                    # default) after every Connection: close answer: descriptors ran out
                    ssl_shutdown_timeout=TLS_SHUTDOWN_S if ctx else None,
                )
        except BaseException as exc:
            for orphan in made:  # cancelled after connection_made (uvloop may then close
                orphan.shut()  # the transport without calling connection_lost)
                orphan.closed = True
                self.conns.discard(orphan)
            self._give_back(slot)
            if bound.expired() and isinstance(exc, TimeoutError):  # (not the caller's
                # cancel arriving with it: that deadline must end the send)
                raise ConnectError(f"cannot connect to {key.ip}:{key.port}: no answer "
                                   f"within {connect_s:g} s") from exc
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):
                err = ConnectError(f"cannot connect to {key.ip}:{key.port}: {exc}")
                err.errno = exc.errno
                raise err from exc
            raise
        return conn

    def _release(self, conn: _Conn) -> None:
        slot = conn.slot
        conn.done()
        if conn.reusable and not self._closed:
            waiters = slot.waiters
            while waiters:
                w = waiters.popleft()
                if not w.done():
                    w.set_result(conn)
                    return
            if self._n_idle < self.max_idle:
                conn.idle_since = self.loop.time()
                slot.idle.append(conn)
                self._n_idle += 1
                if self._sweeper is None:
                    self._sweeper = self.loop.call_later(
                        max(self.idle_timeout_s / 2, 0.05), self._sweep)
                return
        conn.shut()
        self._give_back(slot)

    def _give_back(self, slot: _Slot, *, forget: bool = True) -> None:
        """One connection of ``slot`` is gone: let a waiter open one, or lower the count."""
        waiters = slot.waiters
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(None)
                return
        slot.open -= 1
        if forget and slot.open <= 0 and not slot.idle and self._slots.get(slot.key) is slot:
            del self._slots[slot.key]  # forget keys with no connections (e.g. refused)

    def _sweep(self) -> None:
        self._sweeper = None
        deadline = self.loop.time() - self.idle_timeout_s
        for key, slot in list(self._slots.items()):
            if slot.idle:
                keep: list[_Conn] = []
                for conn in slot.idle:
                    if conn.usable and conn.idle_since > max(
                            deadline, self.loop.time() - conn.idle_limit_s):
                        keep.append(conn)
                    else:
                        conn.shut()
                        self._n_idle -= 1
                        self._give_back(slot)
                slot.idle[:] = keep
            if not slot.idle and slot.open <= 0 and self._slots.get(key) is slot:
                del self._slots[key]
        if self._n_idle and not self._closed:
            self._sweeper = self.loop.call_later(
                max(self.idle_timeout_s / 2, 0.05), self._sweep)
