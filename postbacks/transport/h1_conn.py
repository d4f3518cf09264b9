"""One HTTP/1.1 connection (asyncio Protocol + httptools), the request encoder and the
errors of :mod:`postbacks.transport.h1` (see that module for the policy)."""


from __future__ import annotations

import asyncio
import collections
import math
import select
from dataclasses import dataclass
from typing import NamedTuple, Protocol, cast

import httptools

from postbacks.transport.h1_request import USER_AGENT, InvalidRequest, encode_request

__all__ = [
    "BODY_LIMIT",
    "DISCARD_LIMIT",
    "FRAMING_LIMIT",
    "HEAD_LIMIT",
    "PIECE_LIMIT",
    "USER_AGENT",
    "ConnectError",
    "H1Response",
    "InvalidRequest",
    "PoolKey",
    "PoolSide",
    "ProtocolError",
    "ServerDisconnected",
    "encode_request",
]

BODY_LIMIT = 64 * 1024
DISCARD_LIMIT = 1024 * 1024
# The bytes a response may take before its final status line and headers are complete
# (interim 1xx responses included). httptools gathers a header value split over reads by
# concatenation: a receiver streaming one endless header would cost quadratic time on the
# agent's one event loop, and memory, until the deadline. Servers send a few KiB.
HEAD_LIMIT = 64 * 1024
# The bytes of one response that are not body (head, chunk sizes and extensions, trailers):
# a body is cut by its own count (DISCARD_LIMIT), but trailers are gathered like headers and
# chunk framing is not body. A response with this much of them is cut as malformed.
FRAMING_LIMIT = 4 * 1024 * 1024
# Body chunks beyond one per read, each a Python call on the agent's loop (4 MiB of framing is
# ~600,000 one-byte chunks, ~0.1 s): past this many the body is cut as past DISCARD_LIMIT and
# the status stands (a receiver cannot choose how its chunks are gathered into reads).
PIECE_LIMIT = 4096

_NO_BODY_STATUSES = frozenset({204, 304})


class PoolKey(NamedTuple):
    """Connections are shared only between requests with an equal key."""

    scheme: str  # "http" | "https"
    ip: str  # a vetted address, never a hostname
    port: int
    server_hostname: str | None  # TLS SNI and certificate name; None for http
    # The URL's host, also over plain http: per origin, so two tenants' names on one address
    # never share a connection (a front end routing by a connection's first request).
    host: str | None = None


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


class _Slot:
    """Connections of one key: idle ones (a stack), a count of all open or being opened,
    and requests waiting for one (handed a connection, or None = permission to open one)."""

    __slots__ = ("idle", "key", "open", "waiters")

    def __init__(self, key: PoolKey) -> None:
        self.key = key
        self.idle: list[_Conn] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[_Conn | None]] = collections.deque()


class PoolSide(Protocol):
    """What a connection needs of the pool that owns it (:class:`~postbacks.transport.h1.
    H1Pool`): its loop, its set of open connections, and its reading limits."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    conns: set[_Conn]
    wanted: frozenset[bytes]
    body_limit: int
    discard_limit: int


class _Conn(asyncio.Protocol):
    __slots__ = (
        "_bare", "_body", "_bytes", "_complete", "_extra", "_fd", "_framed", "_fut",
        "_head", "_head_bytes", "_head_size", "_headers", "_interim", "_keep_alive",
        "_kept", "_parser", "_pieces", "_pool", "_read_piece", "_received", "_size",
        "_status", "_truncated", "_until_eof", "closed", "idle_limit_s", "idle_since", "slot",
        "transport", "uses",
    )

    def __init__(self, pool: PoolSide, slot: _Slot) -> None:
        self._pool = pool
        self.slot = slot
        self.transport: asyncio.Transport | None = None
        self._fd = -1
        self._parser = httptools.HttpResponseParser(self)
        # A line ended by LF alone (RFC 9112 2.2: a recipient MAY take it as a line end),
        # as aiohttp, httpx and http.client read a response: hand-written and embedded
        # servers send them, and refusing their 200 re-sent every delivery until exhausted.
        self._parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        self._fut: asyncio.Future[H1Response] | None = None
        self.closed = False
        self.uses = 0
        self.idle_since = 0.0
        self.idle_limit_s = math.inf  # idle longer, it is not reused (the receiver's timeout)
        self._reset(False)

    def _reset(self, head: bool) -> None:
        self._head = head
        self._head_bytes = 0
        self._bare = 0  # bytes after the head in reads that brought no body, in a row
        self._bytes = 0
        self._status = 0
        self._headers: dict[str, str] = {}
        self._head_size = 0  # the status line and headers of the message being read
        self._body: bytes | bytearray = b""  # one piece as read; grown in place past it
        self._kept = 0
        self._size = 0
        self._pieces = 0
        self._read_piece = False
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
    def quiet(self) -> bool:
        """Nothing waits in the socket: no unread byte and no close from the server (one
        poll). Checked before an idle connection carries another request: bytes that
        arrived while the event loop was busy are an answer to no request (a receiver
        answering twice, or a 408 before it closes), and would otherwise be read as the
        next request's answer; and a server's close not yet seen by the loop would cost
        the request written on it (a close leaves nothing for FIONREAD to count, but makes
        the socket readable). (Bytes the loop did read already marked it ``_extra``.)"""
        if self._fd < 0:
            return True
        poller = select.poll()  # (select.select refuses descriptors past 1023)
        poller.register(self._fd, select.POLLIN | select.POLLPRI)
        try:
            return not poller.poll(0)
        except OSError:
            return False

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

    def retire(self) -> None:
        """Carry no other request: closed when released."""
        self._keep_alive = False

    def shut(self) -> None:
        """Close: gracefully after a complete response with the request fully written, at
        once otherwise (a graceful close waits for unwritten bytes to drain, which a
        receiver that answered early and stopped reading never lets happen)."""
        t = self.transport
        if t is not None and not t.is_closing():
            if self._complete and not self._truncated and t.get_write_buffer_size() == 0:
                t.close()
            else:
                t.abort()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")  # TLS too: the transport's own socket
        self._fd = sock.fileno() if sock is not None else -1
        self._pool.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.conns.discard(self)
        fut = self._fut
        if fut is not None and not fut.done():
            if self._until_eof and not self._interim and self._status and (
                    exc is None or not 200 <= self._status < 300):
                # The body was delimited by the end of the connection. A reset may have cut
                # it short (RFC 9112 8): a 2xx is then no proof of delivery (its body may be
                # what a validator judges), while another status says all it has to say (a
                # receiver answering early and closing on a request it never read resets).
                self._truncated = self._truncated or exc is not None
                self._finish()
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
        self._bytes += len(data)
        in_head = self._status == 0
        if in_head:
            self._head_bytes += len(data)
        size = self._size
        self._read_piece = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("unexpected protocol upgrade"))
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # what a callback below raised, if it was one
            self._fail(cause if isinstance(cause, ProtocolError)
                       else ProtocolError(f"malformed HTTP response: {exc}"))
            return
        if in_head and self._status == 0 and self._head_bytes > HEAD_LIMIT:
            # a read ending a head may carry any amount of body; one that does not, and
            # takes the head past the limit, ends the exchange
            self._fail(ProtocolError(f"response head over {HEAD_LIMIT // 1024} KiB"))
        elif self._bytes - self._size > FRAMING_LIMIT:
            self._fail(ProtocolError(f"response framing over {FRAMING_LIMIT // 1048576} MiB"))
        elif not in_head and not self._complete:
            # after the head, reads that bring no body (trailers, chunk extensions) are
            # gathered by the parser as a head is: held to the head's limit in a row
            self._bare = self._bare + len(data) if self._size == size else 0
            if self._bare > HEAD_LIMIT:
                self._fail(ProtocolError(
                    f"response trailers or chunk framing over {HEAD_LIMIT // 1024} KiB"))

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._head_size = 0
        if self._complete:
            self._extra = True  # a second response to one request

    def on_status(self, status: bytes) -> None:
        self._grow_head(len(status))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow_head(len(name) + len(value) + 4)
        if self._status:
            return  # a trailer, or a header of a second response: never taken as the answer's
        lname = name.lower()
        if lname == b"content-length":
            self._framed = True
        elif lname == b"transfer-encoding":
            # Framed only if chunked is the final coding; otherwise the body runs to the end
            # of the connection (RFC 9112 6.3), as llhttp reads it.
            # llhttp skips the whitespace before a coding but only spaces after it: a value
            # ending in a tab is not chunked to it, so the body runs to the end there too.
            last = value.rsplit(b",", 1)[-1].lstrip(b" \t").rstrip(b" ")
            self._framed = last.lower() == b"chunked"
        elif lname in self._pool.wanted:
            self._headers[lname.decode("ascii")] = value.decode("latin-1").strip()

    def on_headers_complete(self) -> None:
        if self._complete:
            return
        status = self._parser.get_status_code()
        if status < 100:
            # llhttp takes any three digits; 0xx is no status at all, and as an "interim"
            # its body would be counted into the real answer's
            raise ProtocolError(f"malformed HTTP response: status {status:03d}")
        if status < 200:
            self._interim = True  # 100 Continue, 103 Early Hints: the real one follows
            return
        self._status = status
        self._head_size = 0  # trailers, if any, have a limit of their own
        self._keep_alive = self._parser.should_keep_alive()
        if self._head:
            self._finish()  # no body follows a HEAD response; not reused (see reusable)
        elif not self._framed and status not in _NO_BODY_STATUSES:
            self._until_eof = True

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        if self._interim:  # (llhttp reads one for 1xx codes other than 100-103)
            raise ProtocolError("malformed HTTP response: a 1xx interim response with a body")
        size = self._size + len(body)
        self._size = size
        if self._read_piece:
            self._pieces += 1
            if self._pieces > PIECE_LIMIT:
                self._truncated = True
                self._finish()  # the answer as far as read; then stop the parser here
                raise ProtocolError(f"response body in over {PIECE_LIMIT} chunks: cut")
        self._read_piece = True
        room = self._pool.body_limit - self._kept
        if room > 0:
            piece = body if len(body) <= room else body[:room]
            if not self._kept:
                self._body = piece
            else:  # one buffer, not one object per read (a body dripped a byte at a time)
                if isinstance(self._body, bytes):
                    self._body = bytearray(self._body)
                self._body += piece
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
                body if isinstance(body, bytes) else bytes(body), self._size, self._truncated,
            ))

    def _grow_head(self, n: int) -> None:
        """Hold one message's head to the limit however it is read: a head that arrives
        whole in one read is over it too (the check in ``data_received`` sees only heads
        still unfinished at the end of a read)."""
        self._head_size += n
        if self._head_size > HEAD_LIMIT:
            raise ProtocolError(f"response head over {HEAD_LIMIT // 1024} KiB")

    def _fail(self, exc: Exception) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        t = self.transport
        if t is not None:
            t.abort()
