"""What a hostile or broken receiver can do to the delivery agent's HTTP client.

The rule: every bad answer ends as a classified attempt outcome (a status, ``timeout`` or
``connection_error``), within the deadline, with bounded memory, and the connection it came
on is never reused in a bad state. Each case runs against a real socket server on 127.0.0.1:
the scripted asyncio servers of ``test_h1`` and, where the client's event loop must be busy
while the receiver acts, a blocking server on its own thread. Waits are bounded (timeouts
on every event, read and join). Needs no Kafka or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from postbacks.core.classify import Retryable, classify
from postbacks.core.render import RenderedRequest
from postbacks.transport.h1 import (
    BODY_LIMIT,
    DISCARD_LIMIT,
    H1Pool,
    PoolKey,
    ProtocolError,
    ServerDisconnected,
)
from postbacks.transport.http import HttpTransport
from tests.integration.test_h1 import (
    Raw,
    Script,
    _req,
    _self_signed,
    get,
    post,
    raw_server,
    read_request,
    run,
)

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
WAIT_S = 5.0  # the bound on every wait for the other side; never reached when all is well


async def _closed(pool: H1Pool) -> None:
    """Until the pool has no open connection (bounded): there is no event to wait for, as
    the connection's end is the transport's (``connection_lost``)."""
    async with asyncio.timeout(WAIT_S):
        while pool.stats()["open"]:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def _second_answer_on_a_new_connection(script: Script, want: tuple[int, bytes]) -> None:
    """The first request is answered ``ok``; the second must get ``want`` on a second
    connection (the first one was not fit to carry it)."""
    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            assert (await get(pool, raw.key(), "/")).body == b"ok"
            second = await asyncio.wait_for(get(pool, raw.key(), "/"), WAIT_S)
            assert (second.status, second.body) == want
            assert raw.connections == 2

    run(main)


# --- a response that is not HTTP/1.x ---------------------------------------------------------

@pytest.mark.parametrize("answer", [
    b"garbage\r\n\r\n",  # a status line that is not one
    b"<html>hello</html>",  # HTTP/0.9: a bare body
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # the HTTP/2 preface
    b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64",  # an HTTP/2 SETTINGS frame
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 1000 Big\r\nContent-Length: 0\r\n\r\n",  # four digits
    b"HTTP/1.1 099 Low\r\nContent-Length: 0\r\n\r\n" + OK,  # no status below 100 exists
    b"HTTP/1.1 000 Zero\r\nContent-Length: 4\r\n\r\njunk" + OK,
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nokk",
    b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1FFFFFFFFFFFFFFFF\r\nok",  # > 2^64
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
], ids=["garbage", "http09", "h2-preface", "h2-frame", "h2-status", "status-1000", "status-099",
        "status-000-with-body", "101-upgrade", "two-content-lengths", "cl-and-te", "te-and-cl",
        "bad-chunk-size", "chunk-size-overflow", "negative-length"])
def test_a_response_that_is_not_http_1_is_a_protocol_error_and_closes(answer: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        await read_request(reader, raw)
        writer.write(answer)
        await writer.drain()
        await reader.read()  # until the client hangs up

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            with pytest.raises(ProtocolError):
                await asyncio.wait_for(get(pool, raw.key(), "/"), WAIT_S)
            await _closed(pool)  # aborted, never pooled
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"))
            assert result.http.status is None and result.http.error_class == "connection_error"
            assert classify(result.http) == Retryable("connection_error")

    run(main)


def test_many_short_header_lines_are_cut_by_the_head_limit() -> None:
    """Not one endless value (test_h1 has that) but endless distinct header lines."""
    sent = [0]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        line = b"X-A: b\r\n" * 1024
        with contextlib.suppress(ConnectionError):
            while sent[0] < 64 * 1024 * 1024:
                writer.write(line)
                sent[0] += len(line)
                await writer.drain()

    async def main() -> None:
        sent[0] = 0
        async with raw_server(script) as raw, H1Pool() as pool:
            with pytest.raises(ProtocolError, match="response head over"):
                await asyncio.wait_for(get(pool, raw.key(), "/"), 20)
            assert sent[0] < 32 * 1024 * 1024

    run(main)


# --- framing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("coding", [b"gzip", b"chunked, gzip"])
def test_a_body_until_close_under_a_non_chunked_transfer_coding_is_a_response(
        coding: bytes) -> None:
    """A transfer coding whose last is not chunked: the body runs to the end of the
    connection (RFC 9112 6.3). That is a complete response, not a dropped connection."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + coding
                     + b"\r\n\r\nnot really gzip")
        await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            resp = await asyncio.wait_for(get(pool, raw.key(), "/"), WAIT_S)
            assert (resp.status, resp.body) == (200, b"not really gzip")
            await _closed(pool)

    run(main)


@pytest.mark.parametrize("opening, piece", [
    (b"HTTP/1.1 200 OK\r\n\r\n", b"x" * 65536),  # until the end of the connection
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n", b"x" * 65536),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
     b"10000\r\n" + b"x" * 65536 + b"\r\n"),
], ids=["until-close", "one-enormous-chunk", "endless-chunks"])
def test_an_endless_body_is_cut_at_the_discard_limit(opening: bytes, piece: bytes) -> None:
    sent = [0]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(opening)
        with contextlib.suppress(ConnectionError):
            while sent[0] < 256 * 1024 * 1024:  # bounded: 256 MiB at most
                writer.write(piece)
                sent[0] += len(piece)
                await writer.drain()

    async def main() -> None:
        sent[0] = 0
        async with raw_server(script) as raw, H1Pool() as pool:
            resp = await asyncio.wait_for(get(pool, raw.key(), "/"), 20)
            assert resp.status == 200 and resp.truncated
            assert resp.body == b"x" * BODY_LIMIT
            assert DISCARD_LIMIT < resp.body_size < 2 * DISCARD_LIMIT
            await _closed(pool)
        sent[0] = 0
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"))
            assert result.http.status == 200 and result.body == b"x" * BODY_LIMIT
        # what the sockets' buffers took, not the 256 MiB the server would have sent
        assert sent[0] < 64 * 1024 * 1024

    run(main)


# --- interim responses ----------------------------------------------------------------------------

def test_103_early_hints_before_the_answer_lend_it_no_header_and_the_connection_is_reused() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        while True:
            await read_request(reader, raw)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\nLocation: /elsewhere\r\n"
                         b"Retry-After: 9\r\n\r\n"
                         b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
            await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            for _ in range(3):
                resp = await asyncio.wait_for(post(pool, raw.key(), "/"), WAIT_S)
                assert (resp.status, resp.headers, resp.body) == (200, {}, b"ok")
            assert (raw.connections, raw.requests) == (1, 3)

    run(main)


# --- the request not read, or answered early ----------------------------------------------------

def test_a_receiver_that_never_reads_ends_in_timeout_and_its_connection_is_dropped() -> None:
    async def main() -> None:
        release = asyncio.Event()  # one per event loop: run() uses two

        async def script(reader: asyncio.StreamReader, _w: asyncio.StreamWriter,
                         _r: Raw) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), WAIT_S)  # accepted, never read

        body = b"x" * (8 * 1024 * 1024)  # more than both sockets' buffers take
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=0.3, allow_loopback=True) as t:
            loop = asyncio.get_running_loop()
            started = loop.time()
            url = f"http://127.0.0.1:{raw.port}/"
            small, big = await asyncio.gather(
                t.send(_req(url)),
                t.send(RenderedRequest(method="POST", url=url, headers={}, body=body)))
            took = loop.time() - started
            assert small.http.error_class == big.http.error_class == "timeout"
            assert took < 2.0, took
            pool = t._pool
            assert isinstance(pool, H1Pool)
            await _closed(pool)
            release.set()

    run(main)


def test_an_answer_before_the_request_is_read_then_close_is_classified() -> None:
    """The receiver reads the head, answers 413 and closes, with most of the body unsent.
    Its close may reach us as a reset before we read the answer: either outcome is fine,
    a hang or a crash is not."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        body = b"x" * (8 * 1024 * 1024)
        async with raw_server(script) as raw, H1Pool() as pool:
            try:
                resp = await asyncio.wait_for(post(pool, raw.key(), "/", body), WAIT_S)
                assert resp.status == 413
            except ServerDisconnected:
                pass
            await _closed(pool)

    run(main)


def test_an_early_answer_on_a_connection_whose_receiver_stops_reading_does_not_leak_it() -> None:
    """The receiver answers 413 (keep-alive) after the head and then neither reads nor closes:
    our request's body is still unwritten, so the connection cannot be reused, and a graceful
    close would wait for the body to drain, i.e. forever."""
    async def main() -> None:
        release = asyncio.Event()

        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         _r: Raw) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 413 Too Large\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), WAIT_S)

        body = b"x" * (8 * 1024 * 1024)
        async with raw_server(script) as raw, H1Pool() as pool:
            resp = await asyncio.wait_for(post(pool, raw.key(), "/", body), WAIT_S)
            assert resp.status == 413
            try:
                await _closed(pool)
            finally:
                release.set()

    run(main)


# --- slow receivers: the deadline ---------------------------------------------------------------

@pytest.mark.parametrize("head, drip", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", b"x"),  # the body, a byte at a time
    (b"HTTP/1.1 200 OK\r\n", b"X"),  # the head, never ending, a byte at a time
], ids=["body", "head"])
def test_a_dripping_receiver_ends_at_the_deadline(head: bytes, drip: bytes) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(head)
        for _ in range(1000):  # 1 byte per 20 ms: 20 s if nothing stopped it
            writer.write(drip)
            await writer.drain()
            await asyncio.sleep(0.02)

    async def main() -> None:
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=0.3, allow_loopback=True) as t:
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await asyncio.wait_for(t.send(_req(f"http://127.0.0.1:{raw.port}/")), 10)
            took = loop.time() - started
            assert result.http.error_class == "timeout" and took < 2.0, (result, took)
            pool = t._pool
            assert isinstance(pool, H1Pool)
            await _closed(pool)

    run(main)


# --- more than one answer to one request ----------------------------------------------------

def test_a_second_answer_in_the_same_read_is_not_taken_for_the_next_request() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        await read_request(reader, raw)
        if raw.connections == 1:
            writer.write(OK + b"HTTP/1.1 500 Stale\r\nContent-Length: 5\r\n\r\nstale")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")
        await writer.drain()
        await reader.read()

    _second_answer_on_a_new_connection(script, (200, b"fresh"))


def test_unsolicited_bytes_on_an_idle_connection_close_it() -> None:
    """E.g. a ``408`` a server sends on an idle connection before closing it (or never)."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        await read_request(reader, raw)
        writer.write(OK)
        await writer.drain()
        if raw.connections == 1:
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        await reader.read()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            assert (await get(pool, raw.key(), "/")).body == b"ok"
            await _closed(pool)  # the 408 arrived while idle: closed, not kept
            assert (await get(pool, raw.key(), "/")).status == 200
            assert raw.connections == 2

    run(main)


def _read_head(conn: socket.socket) -> bool:
    """One request head from a blocking socket (GETs: no body); False if the peer left."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
    except OSError:
        return False
    return True


@contextlib.contextmanager
def thread_server(handler: Callable[[socket.socket, int], None]) -> Iterator[int]:
    """A blocking server on 127.0.0.1 on its own threads: ``handler(conn, n)`` serves
    connection number ``n`` (from 1). Yields the port."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    lsock.settimeout(0.05)  # the accept loop's check for `stop`
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def serve(conn: socket.socket, n: int) -> None:
        with conn:
            conn.settimeout(WAIT_S)
            with contextlib.suppress(OSError):
                handler(conn, n)

    def accept() -> None:
        n = 0
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            n += 1
            t = threading.Thread(target=serve, args=(conn, n), daemon=True)
            threads.append(t)
            t.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield lsock.getsockname()[1]
    finally:
        stop.set()
        acceptor.join(WAIT_S)
        for t in threads:
            t.join(WAIT_S)
        lsock.close()


def test_a_second_answer_waiting_unread_on_an_idle_connection_is_not_the_next_answer() -> None:
    """The receiver answers request 1 twice, the second answer in its own segment. While the
    agent's event loop is busy (blocked here on purpose) that answer sits unread in the
    socket's buffer; the next request must not take it for its own answer."""
    async def main() -> None:
        go, stale_sent = threading.Event(), threading.Event()

        def handler(conn: socket.socket, n: int) -> None:
            if n == 1:
                _read_head(conn)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
                if go.wait(WAIT_S):
                    conn.sendall(b"HTTP/1.1 500 Stale\r\nContent-Length: 5\r\n\r\nstale")
                    stale_sent.set()
                if _read_head(conn):  # a second request on this connection: answered, late
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
            elif _read_head(conn):
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfresh")

        with thread_server(handler) as port:
            key = PoolKey("http", "127.0.0.1", port, None)
            async with H1Pool() as pool:
                assert (await get(pool, key, "/")).body == b"first"
                go.set()
                assert stale_sent.wait(WAIT_S)  # blocks the loop: the stale answer stays unread
                second = await asyncio.wait_for(get(pool, key, "/"), WAIT_S)
                assert (second.status, second.body) == (200, b"fresh")

    run(main)


# --- the connection's end -----------------------------------------------------------------------

@pytest.mark.parametrize("first", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",  # 1.0 without keep-alive: close
], ids=["connection-close", "http-1.0"])
def test_a_connection_the_receiver_asked_to_close_is_not_reused(first: bytes) -> None:
    """The receiver says close but keeps the connection open and would answer on it."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        n = raw.connections
        await read_request(reader, raw)
        writer.write(first if n == 1 else OK)
        await writer.drain()
        if await reader.read(1):  # a request on the connection it was asked to close
            writer.write(b"HTTP/1.1 500 Reused\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        await reader.read()

    _second_answer_on_a_new_connection(script, (200, b"ok"))


def test_an_error_answered_without_reading_the_body_does_not_garble_the_next_request() -> None:
    """The receiver answers 401 from the request's head alone and keeps the connection:
    its unread body would be parsed as the next request there (the next delivery got a
    501 for bytes it never sent, and the receiver never saw it)."""
    seen: list[bytes] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            line = head.split(b"\r\n", 1)[0]
            seen.append(line)
            if line.startswith(b"POST /refused "):  # the body is left unread
                writer.write(b"HTTP/1.1 401 No\r\nContent-Length: 0\r\n\r\n")
            elif line.startswith((b"POST ", b"GET ")):
                for h in head.split(b"\r\n"):
                    if h.lower().startswith(b"content-length:"):
                        await reader.readexactly(int(h.split(b":", 1)[1]))
                writer.write(OK)
            else:  # the unread body and the next request's head, read as one request
                writer.write(b"HTTP/1.1 400 Bad\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            assert (await post(pool, raw.key(), "/refused")).status == 401
            second = await asyncio.wait_for(post(pool, raw.key(), "/next"), WAIT_S)
            assert (second.status, second.body) == (200, b"ok")
            assert raw.connections == 2
            assert (await get(pool, raw.key(), "/after")).status == 200  # a 2xx keeps it
            assert raw.connections == 2
        requests = [ln.split(b" ")[1] for ln in seen if ln.startswith((b"POST ", b"GET "))]
        assert requests == [b"/refused", b"/next", b"/after"], seen
        seen.clear()  # (run() runs main on each event loop)

    run(main)


@pytest.mark.parametrize(("answer", "connections"), [
    (b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", 1),  # read it all: kept
    (b"HTTP/1.1 404 No\r\nContent-Length: 0\r\n\r\n", 1),
    (b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=0\r\nContent-Length: 0\r\n\r\n", 2),
])
def test_which_answers_keep_the_connection(answer: bytes, connections: int) -> None:
    """A receiver that read the request and failed it keeps its connection (a new one per
    failed delivery would load a receiver already in trouble); one that keeps none idle
    (timeout=0) gets a new one for every request."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        while True:
            try:
                await read_request(reader, raw)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(answer)
            await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            for _ in range(2):
                await asyncio.wait_for(post(pool, raw.key(), "/"), WAIT_S)
            assert raw.connections == connections

    run(main)


def test_a_connection_idle_near_the_receivers_keep_alive_timeout_is_not_reused() -> None:
    """The receiver says ``Keep-Alive: timeout=1`` and closes an idle connection on its
    timer -- here, as the next request arrives half a second or more later, the race a
    Node or Apache receiver (5 s) wins now and then. A request written on it was a failed
    attempt; past half the timeout (a second short of it from 2 s) a new one carries it."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await read_request(reader, raw)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            idle = loop.time() - getattr(writer, "answered_at", loop.time())
            if idle >= 0.5:  # its timer fired as the request came: closed unanswered
                writer.close()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=1, max=100\r\n"
                         b"Content-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.answered_at = loop.time()  # type: ignore[attr-defined]

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            assert (await post(pool, raw.key(), "/")).status == 200
            assert (await post(pool, raw.key(), "/")).status == 200  # at once: reused
            assert raw.connections == 1
            await asyncio.sleep(0.7)
            second = await asyncio.wait_for(post(pool, raw.key(), "/"), WAIT_S)
            assert (second.status, second.body) == (200, b"ok")
            assert raw.connections == 2

    run(main)


# --- answers the transport reads: redirects, Retry-After -----------------------------------

def test_a_redirect_is_not_followed_by_default_not_even_to_a_live_server() -> None:
    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        await read_request(reader, raw)
        writer.write(OK)
        await writer.drain()

    async def main() -> None:
        async with raw_server(target) as other:
            async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             raw: Raw) -> None:
                await read_request(reader, raw)
                writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:"
                             + str(other.port).encode() + b"/x\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()

            async with raw_server(script) as raw, HttpTransport(
                    timeout_s=WAIT_S, allow_loopback=True) as t:
                result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"))
                assert result.http.status == 307 and result.blocked is None
                assert other.connections == 0

    run(main)


def test_a_redirect_chain_ends_at_one_deadline_for_the_whole_send() -> None:
    """With redirects enabled, each hop answered just inside the timeout: the send as a
    whole still ends at its deadline, not hops x the timeout."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        while True:
            await read_request(reader, raw)
            await asyncio.sleep(0.25)  # the receiver's pace: each hop inside the 0.4-s timeout
            writer.write(b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /hop"
                         + str(raw.requests).encode() + b"\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=0.4, allow_loopback=True) as t:
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"),
                                  follow_redirects=True, max_redirects=3)
            took = loop.time() - started
            # per hop, the 4 hops would take 1 s and end with the last 307
            assert result.http.error_class == "timeout", result
            assert took < 0.9, took
            assert raw.requests == 2

    run(main)


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan", "inf", "1e999", "-inf"])
def test_a_non_finite_retry_after_is_ignored(value: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Busy\r\nRetry-After: " + value.encode()
                     + b"\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"))
            after = result.http.retry_after_s
            assert result.http.status == 503
            assert after is None or math.isfinite(after), after

    run(main)



def test_tls_keep_alive_connections_are_still_reused(tmp_path: Path) -> None:
    """The unread-bytes check looks at the TLS connection's own socket: a TLS 1.3 session
    ticket or the like, read by the event loop, must not make every reuse a new connection."""
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def main() -> None:
        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         raw: Raw) -> None:
            while True:
                await read_request(reader, raw)
                writer.write(OK)
                await writer.drain()

        raw = Raw(port=0)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            raw.connections += 1
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await script(reader, writer, raw)
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
        port = server.sockets[0].getsockname()[1]
        try:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with H1Pool(ssl_context=trusting) as pool:
                key_ = PoolKey("https", "127.0.0.1", port, "localhost")
                for _ in range(5):
                    resp = await asyncio.wait_for(
                        pool.request(key_, "GET", "/", "localhost", {}), WAIT_S)
                    assert (resp.status, resp.body) == (200, b"ok")
                assert (raw.connections, raw.requests) == (1, 5)
        finally:
            server.close()
            await server.wait_closed()

    run(main)
