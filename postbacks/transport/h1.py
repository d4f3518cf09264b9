"""A minimal, fast HTTP/1.1 client for the delivery hot path (asyncio Protocol + httptools).

Why not aiohttp's ClientSession: it costs ~110 µs of CPU per keep-alive POST on this class
of machine (see /work/shared/notes/local-kafka.md), about half the agent's budget per
delivery. This client does only what a postback needs:

* one ``transport.write`` per request (request line, headers, body);
* the response parsed by llhttp (``httptools.HttpResponseParser``, C): status, the few
  headers asked for (``Retry-After``, ``Location``), body framing by Content-Length,
  chunked or end-of-connection, 1xx interim responses skipped, 204/304 without a body;
* the first ``body_limit`` (64 KiB) body bytes kept; the rest read and discarded, or, past
  ``discard_limit`` (1 MiB), the connection closed (the response still counts);
* a keep-alive pool per :class:`PoolKey` ``(scheme, ip, port, server_hostname)``: the caller
  connects to an address it has already vetted, never to a name (no DNS here at all);
  at most ``max_per_key`` connections per key (further requests wait for one), at most
  ``max_total`` requests in flight, idle connections closed after ``idle_timeout_s``.
  A connection goes back to the pool only once its response was read to the end, the
  server did not ask to close it and nothing is left unwritten; anything else closes it;
* TLS through ``loop.create_connection(ssl=..., server_hostname=...)`` with the default
  (verifying) context;
* a total timeout per request via ``asyncio.timeout`` (connect + write + read).

Stale keep-alive connections: a server may close an idle connection just as a request is
written on it. If a request on a *reused* connection fails before a single byte of the
response arrived, it is re-sent once on a fresh connection. The server may in principle
have processed the first copy; this is acceptable here because every postback carries an
idempotency key (receivers must de-duplicate anyway, as the pipeline delivers at least
once). A request on a fresh connection, or one that saw part of a response, is never re-sent.

Errors are ``OSError`` subclasses, so callers can map them in one place: :class:`ConnectError`
(could not connect, including TLS verification), :class:`ServerDisconnected` (closed before
the response was complete), :class:`ProtocolError` (malformed response), ``TimeoutError``
(from ``asyncio.timeout``). :class:`InvalidRequest` (a ``ValueError``) refuses request text
that could split the request (CR, LF or NUL in the target or a header).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from dataclasses import dataclass
from typing import NamedTuple, cast

import httptools

from postbacks import __version__

__all__ = [
    "BODY_LIMIT",
    "DISCARD_LIMIT",
    "USER_AGENT",
    "ConnectError",
    "H1Pool",
    "H1Response",
    "InvalidRequest",
    "PoolKey",
    "ProtocolError",
    "ServerDisconnected",
    "encode_request",
]

USER_AGENT = f"postbacks/{__version__}"
BODY_LIMIT = 64 * 1024
DISCARD_LIMIT = 1024 * 1024

# Set by this client from its arguments; a caller's copy is dropped.
_OWN_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
    "te", "trailer", "proxy-connection", "expect",
})
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
_NO_BODY_STATUSES = frozenset({204, 304})


class PoolKey(NamedTuple):
    """Connections are shared only between requests with an equal key."""

    scheme: str  # "http" | "https"
    ip: str  # a vetted address, never a hostname
    port: int
    server_hostname: str | None  # TLS SNI and certificate name; None for http


@dataclass(frozen=True, slots=True)
class H1Response:
    status: int
    headers: dict[str, str]  # only the wanted ones, lower-case names
    body: bytes  # the first ``body_limit`` bytes
    body_size: int  # body bytes received (all of them unless ``truncated``)
    truncated: bool  # more than ``discard_limit``: the connection was closed unread


class ConnectError(ConnectionError):
    """The connection (TCP or TLS) could not be established."""


class ServerDisconnected(ConnectionResetError):
    """The connection ended before the response was complete."""

    def __init__(self, received: bool, cause: Exception | None = None) -> None:
        what = "after part of the response" if received else "before any response byte"
        super().__init__(f"server closed the connection {what}"
                         + (f": {cause}" if cause else ""))
        self.received = received


class ProtocolError(ConnectionError):
    """The response is not valid HTTP/1.x."""


class InvalidRequest(ValueError):
    """The request text would not be a single, well-formed HTTP request."""


def encode_request(
    method: str, target: str, host: str, headers: dict[str, str], body: bytes | None,
    user_agent: str = USER_AGENT,
) -> bytes:
    """The request bytes: ``Host``, the caller's headers (minus those this client owns),
    ``User-Agent`` unless given, ``Content-Length`` when there is a body (or the method
    normally has one). Raises :class:`InvalidRequest` on CR/LF/NUL anywhere."""
    parts = [method, " ", target, " HTTP/1.1\r\nHost: ", host, "\r\n"]
    lines = 3  # request line, Host, the blank line
    agent = True
    for name, value in headers.items():
        lname = name.lower()
        if lname in _OWN_HEADERS:
            continue
        if lname == "user-agent":
            agent = False
        parts += (name, ": ", value, "\r\n")
        lines += 1
    if agent:
        parts += ("User-Agent: ", user_agent, "\r\n")
        lines += 1
    if body or (body is not None and method in ("POST", "PUT", "PATCH")):
        parts += ("Content-Length: ", str(len(body)), "\r\n")
        lines += 1
    parts.append("\r\n")
    head = "".join(parts)
    # Every CR and LF must be one written here: no request splitting through any text.
    if (head.count("\n") != lines or head.count("\r") != lines or "\x00" in head
            or not method.isalpha() or " " in target or not target):
        raise InvalidRequest(f"refusing to send a malformed request to {host!r}")
    data = head.encode("utf-8")
    return data + body if body else data


class _Slot:
    """Connections of one key: idle ones (a stack), a count of all open or being opened,
    and requests waiting for one (handed a connection, or None = permission to open one)."""

    __slots__ = ("idle", "key", "open", "waiters")

    def __init__(self, key: PoolKey) -> None:
        self.key = key
        self.idle: list[_Conn] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[_Conn | None]] = collections.deque()


class _Conn(asyncio.Protocol):
    __slots__ = (
        "_body", "_complete", "_extra", "_framed", "_fut", "_head", "_headers", "_interim",
        "_keep_alive", "_kept", "_parser", "_pool", "_received", "_size", "_status",
        "_truncated", "_until_eof", "closed", "idle_since", "slot", "transport", "uses",
    )

    def __init__(self, pool: H1Pool, slot: _Slot) -> None:
        self._pool = pool
        self.slot = slot
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._fut: asyncio.Future[H1Response] | None = None
        self.closed = False
        self.uses = 0
        self.idle_since = 0.0
        self._reset(False)

    def _reset(self, head: bool) -> None:
        self._head = head
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._kept = 0
        self._size = 0
        self._received = False
        self._framed = False
        self._until_eof = False
        self._keep_alive = False
        self._interim = False
        self._complete = False
        self._truncated = False
        self._extra = False

    # -- used by the pool ------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        t = self.transport
        return not self.closed and t is not None and not t.is_closing()

    @property
    def reusable(self) -> bool:
        t = self.transport
        return (self._complete and self._keep_alive and not self._until_eof
                and not self._head and not self._truncated and not self._extra
                and not self.closed and t is not None and not t.is_closing()
                and t.get_write_buffer_size() == 0)

    def send(self, data: bytes, head: bool) -> asyncio.Future[H1Response]:
        t = self.transport
        if self.closed or t is None or t.is_closing():
            raise ServerDisconnected(False)
        self._reset(head)
        fut: asyncio.Future[H1Response] = self._pool.loop.create_future()
        self._fut = fut
        self.uses += 1
        t.write(data)
        return fut

    def done(self) -> None:
        self._fut = None

    def shut(self) -> None:
        """Close: gracefully after a complete response, at once otherwise."""
        t = self.transport
        if t is not None and not t.is_closing():
            if self._complete and not self._truncated:
                t.close()
            else:
                t.abort()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._pool.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.conns.discard(self)
        fut = self._fut
        if fut is not None and not fut.done():
            if self._until_eof and not self._interim and self._status:
                self._finish()  # the body was delimited by the end of the connection
            else:
                fut.set_exception(ServerDisconnected(self._received, exc))

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def data_received(self, data: bytes) -> None:
        fut = self._fut
        if fut is None or fut.done():
            if not self._truncated:
                self._extra = True  # unsolicited bytes: never reuse
                self.shut()
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("unexpected protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"malformed HTTP response: {exc}"))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._complete:
            self._extra = True  # a second response to one request

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname in _FRAMING:
            self._framed = True
        elif lname in self._pool.wanted:
            self._headers[lname.decode("ascii")] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        if self._complete:
            return
        status = self._parser.get_status_code()
        if status < 200:
            self._interim = True  # 100 Continue, 103 Early Hints: the real one follows
            return
        self._status = status
        self._keep_alive = self._parser.should_keep_alive()
        if self._head:
            self._finish()  # no body follows a HEAD response; not reused (see reusable)
        elif not self._framed and status not in _NO_BODY_STATUSES:
            self._until_eof = True

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        size = self._size + len(body)
        self._size = size
        room = self._pool.body_limit - self._kept
        if room > 0:
            piece = body if len(body) <= room else body[:room]
            self._body.append(piece)
            self._kept += len(piece)
        if size > self._pool.discard_limit:
            self._truncated = True
            self._finish()
            self.shut()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self._headers = {}
            self._framed = False
            return
        if not self._complete:
            self._finish()

    # -- internals -------------------------------------------------------------------------

    def _finish(self) -> None:
        self._complete = True
        fut = self._fut
        if fut is not None and not fut.done():
            body = self._body
            fut.set_result(H1Response(
                self._status, self._headers,
                body[0] if len(body) == 1 else b"".join(body), self._size, self._truncated,
            ))

    def _fail(self, exc: Exception) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        t = self.transport
        if t is not None:
            t.abort()


class H1Pool:
    """Keep-alive HTTP/1.1 connections per :class:`PoolKey`; see the module doc."""

    def __init__(
        self, *, max_per_key: int = 64, max_total: int = 512, max_idle: int | None = None,
        idle_timeout_s: float = 30.0, ssl_context: ssl.SSLContext | None = None,
        body_limit: int = BODY_LIMIT, discard_limit: int = DISCARD_LIMIT,
        user_agent: str = USER_AGENT, wanted_headers: tuple[str, ...] = ("retry-after", "location"),
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
    ) -> H1Response:
        """Send one request on a pooled connection to ``key`` and read the response.

        ``target`` is the request target (path and query, already encoded), ``host`` the
        Host header value. Raises :class:`InvalidRequest`, ``TimeoutError`` or an
        ``OSError`` (:class:`ConnectError`, :class:`ServerDisconnected`, ...).
        """
        data = encode_request(method, target, host, headers, body, self.user_agent)
        head = method == "HEAD"
        if timeout_s is None:
            return await self._send(key, data, head)
        async with asyncio.timeout(timeout_s):
            return await self._send(key, data, head)

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

    async def _send(self, key: PoolKey, data: bytes, head: bool) -> H1Response:
        if self._closed:
            raise ConnectionError("connection pool closed")
        async with self._limit:
            conn = await self._acquire(key)
            try:
                resp = await conn.send(data, head)
            except ServerDisconnected as exc:
                if exc.received or conn.uses < 2:
                    self._release(conn)
                    raise
                # A stale keep-alive connection: re-send once on a fresh one (module doc).
                slot = conn.slot
                conn.done()
                conn.shut()
                conn = await self._open(key, slot)
                try:
                    resp = await conn.send(data, head)
                except BaseException:
                    self._release(conn)
                    raise
            except BaseException:
                self._release(conn)
                raise
            self._release(conn)
            return resp

    # -- the pool --------------------------------------------------------------------------

    async def _acquire(self, key: PoolKey) -> _Conn:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(key)
        idle = slot.idle
        while idle:
            conn = idle.pop()
            self._n_idle -= 1
            if conn.usable:
                return conn
            conn.shut()
            self._give_back(slot, forget=False)
        if slot.open < self.max_per_key:
            slot.open += 1
            return await self._open(key, slot)
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
        if handed is not None and handed.usable:
            return handed
        if handed is not None:
            handed.shut()
        return await self._open(key, slot)

    async def _open(self, key: PoolKey, slot: _Slot) -> _Conn:
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

        try:
            _, conn = await self.loop.create_connection(
                factory, key.ip, key.port, ssl=ctx,
                server_hostname=(key.server_hostname or key.ip) if ctx else None,
            )
        except BaseException as exc:
            for orphan in made:  # cancelled after connection_made (uvloop may then close
                orphan.shut()  # the transport without calling connection_lost)
                orphan.closed = True
                self.conns.discard(orphan)
            self._give_back(slot)
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
                    if conn.usable and conn.idle_since > deadline:
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
