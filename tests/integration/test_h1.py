"""The HTTP/1.1 client (postbacks.transport.h1) against real servers on 127.0.0.1.

An aiohttp.web server for ordinary behaviour, and small scripted asyncio servers for what
a well-behaved server never does (closing mid-response, ignoring a reused connection).
Traffic only ever goes to 127.0.0.1. Needs no Kafka or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvloop
from aiohttp import web

from postbacks import __version__
from postbacks.core.render import RenderedRequest
from postbacks.transport.h1 import (
    BODY_LIMIT,
    TLS_SHUTDOWN_S,
    ConnectError,
    H1Pool,
    H1Response,
    InvalidRequest,
    PoolKey,
    ProtocolError,
    ServerDisconnected,
)
from postbacks.transport.http import HttpTransport

BIG = 200 * 1024
HUGE = 3 * 1024 * 1024


@dataclass
class Web:
    port: int
    peers: set[tuple[str, int]] = field(default_factory=set)
    peer_log: list[tuple[str, int]] = field(default_factory=list)  # each request's peer
    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    active: int = 0
    max_active: int = 0

    def key(self) -> PoolKey:
        return PoolKey("http", "127.0.0.1", self.port, None)


@asynccontextmanager
async def web_server(keepalive_timeout: float = 75.0) -> AsyncIterator[Web]:
    srv = Web(port=0)

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        assert request.transport is not None
        srv.peers.add(request.transport.get_extra_info("peername"))
        srv.peer_log.append(request.transport.get_extra_info("peername"))
        headers = {str(k).lower(): v for k, v in request.headers.items()}
        srv.requests.append((request.method, request.path_qs, headers, await request.read()))
        srv.active += 1
        srv.max_active = max(srv.max_active, srv.active)
        try:
            return await handler(request)
        finally:
            srv.active -= 1

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("s", "0.05")))
        return web.Response(text="slow")

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(5):
            await resp.write(f"part{i};".encode())
        await resp.write_eof()
        return resp

    async def big(request: web.Request) -> web.Response:
        return web.Response(body=b"b" * int(request.query["n"]))

    async def no_content(_: web.Request) -> web.Response:
        return web.Response(status=204)

    async def busy(_: web.Request) -> web.Response:
        return web.Response(status=503, headers={"Retry-After": "7"}, text="busy")

    async def moved(_: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/landing?x=1"})

    app = web.Application(middlewares=[record])
    app.add_routes([
        web.route("*", "/ok", ok), web.route("*", "/slow", slow),
        web.get("/chunked", chunked), web.get("/big", big), web.post("/204", no_content),
        web.post("/busy", busy), web.post("/moved", moved),
    ])
    runner = web.AppRunner(app, keepalive_timeout=keepalive_timeout)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    srv.port = runner.addresses[0][1]
    try:
        yield srv
    finally:
        await runner.cleanup()


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Raw"], Awaitable[None]]


@dataclass
class Raw:
    port: int
    connections: int = 0
    requests: int = 0

    def key(self) -> PoolKey:
        return PoolKey("http", "127.0.0.1", self.port, None)


@asynccontextmanager
async def raw_server(script: Script) -> AsyncIterator[Raw]:
    """A scripted server: ``script(reader, writer, raw)`` handles connection number
    ``raw.connections``."""
    raw = Raw(port=0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw.connections += 1
        try:
            await script(reader, writer, raw)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    raw.port = server.sockets[0].getsockname()[1]
    try:
        yield raw
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader, raw: Raw | None = None) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))
    if raw is not None:
        raw.requests += 1
    return head


def run(main: Callable[[], Awaitable[None]]) -> None:
    """``main()`` under the standard event loop, then under uvloop (what the agent runs)."""

    async def wrapped() -> None:
        await main()

    asyncio.run(wrapped())
    uvloop.run(wrapped())


async def get(
    pool: H1Pool, key: PoolKey, path: str, timeout_s: float | None = None
) -> H1Response:
    return await pool.request(key, "GET", path, f"127.0.0.1:{key.port}", {}, None,
                              timeout_s=timeout_s)


async def post(
    pool: H1Pool, key: PoolKey, path: str, body: bytes = b'{"id":"dlv_1"}'
) -> H1Response:
    return await pool.request(key, "POST", path, f"127.0.0.1:{key.port}",
                              {"content-type": "application/json"}, body)


# --- keep-alive and the pool bound ------------------------------------------------------------

def test_sequential_requests_share_one_connection_and_are_well_formed() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            for i in range(10):
                resp = await post(pool, srv.key(), f"/ok?i={i}")
                assert (resp.status, resp.body, resp.truncated) == (200, b"ok", False)
            assert len(srv.peers) == 1
            assert pool.stats() == {"open": 1, "idle": 1}
            method, path, headers, body = srv.requests[3]
            assert (method, path, body) == ("POST", "/ok?i=3", b'{"id":"dlv_1"}')
            assert headers["host"] == f"127.0.0.1:{srv.port}"
            assert headers["user-agent"] == f"postbacks/{__version__}"
            assert headers["content-length"] == "14"
            assert headers["content-type"] == "application/json"

    run(main)


def test_pool_bound_holds_under_concurrency() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool(max_per_key=4) as pool:
            results = await asyncio.gather(*(get(pool, srv.key(), "/slow?s=0.05")
                                             for _ in range(40)))
            assert [r.status for r in results] == [200] * 40
            assert srv.max_active <= 4
            assert len(srv.peers) <= 4
            assert pool.stats()["open"] <= 4

    run(main)


def test_total_in_flight_bound() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool(max_per_key=8, max_total=2) as pool:
            results = await asyncio.gather(*(get(pool, srv.key(), "/slow?s=0.02")
                                             for _ in range(12)))
            assert {r.status for r in results} == {200}
            assert srv.max_active <= 2

    run(main)


def test_timeouts_and_cancellations_leave_the_pool_consistent() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool(max_per_key=4, max_total=6) as pool:
            async def one(i: int) -> int:
                try:
                    r = await get(pool, srv.key(), f"/slow?s={(0, 0.01, 0.05, 0.2)[i % 4]}",
                                  timeout_s=(0.02, 0.1, 1.0)[i % 3])
                    return r.status
                except TimeoutError:
                    return 0

            tasks = [asyncio.ensure_future(one(i)) for i in range(120)]
            for t in tasks[::7]:
                await asyncio.sleep(0.005)
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.05)
            stats = pool.stats()
            assert stats["open"] == stats["idle"] <= 4  # nothing in use, nothing leaked
            async with asyncio.timeout(5):  # every permit came back: no deadlock
                results = await asyncio.gather(*(get(pool, srv.key(), "/ok") for _ in range(8)))
            assert {r.status for r in results} == {200}

    run(main)


def test_idle_connections_are_closed_after_the_idle_timeout() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool(idle_timeout_s=0.1) as pool:
            await get(pool, srv.key(), "/ok")
            assert pool.stats() == {"open": 1, "idle": 1}
            await asyncio.sleep(0.4)
            assert pool.stats() == {"open": 0, "idle": 0}
            assert (await get(pool, srv.key(), "/ok")).status == 200

    run(main)


# --- response framing -------------------------------------------------------------------------

def test_chunked_response_then_reuse() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            resp = await get(pool, srv.key(), "/chunked")
            assert resp.status == 200
            assert resp.body == b"part0;part1;part2;part3;part4;"
            assert (await get(pool, srv.key(), "/ok")).body == b"ok"
            assert len(srv.peers) == 1

    run(main)


def test_large_body_is_capped_at_64k_and_the_rest_discarded() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            resp = await get(pool, srv.key(), f"/big?n={BIG}")
            assert resp.status == 200 and len(resp.body) == BODY_LIMIT == 64 * 1024
            assert resp.body_size == BIG and not resp.truncated
            assert (await get(pool, srv.key(), "/ok")).body == b"ok"
            assert len(srv.peers) == 1  # read to the end, so reused

    run(main)


def test_huge_body_closes_the_connection() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            resp = await get(pool, srv.key(), f"/big?n={HUGE}")
            assert resp.status == 200 and len(resp.body) == BODY_LIMIT and resp.truncated
            assert (await get(pool, srv.key(), "/ok")).body == b"ok"
            assert len(srv.peers) == 2

    run(main)


def test_204_has_no_body_and_keeps_the_connection() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            resp = await post(pool, srv.key(), "/204")
            assert (resp.status, resp.body) == (204, b"")
            assert (await get(pool, srv.key(), "/ok")).status == 200
            assert len(srv.peers) == 1

    run(main)


def test_get_without_body_sends_no_content_length() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            assert (await get(pool, srv.key(), "/ok")).status == 200
            _, _, headers, body = srv.requests[0]
            assert body == b"" and "content-length" not in headers

    run(main)


def test_retry_after_and_location_are_surfaced() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            busy = await post(pool, srv.key(), "/busy")
            assert busy.status == 503 and busy.headers["retry-after"] == "7"
            moved = await post(pool, srv.key(), "/moved")
            assert moved.status == 302 and moved.headers == {"location": "/landing?x=1"}

    run(main)


def test_body_until_close_interim_100_and_connection_close() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        await read_request(reader)
        if raw.connections == 1:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        else:
            writer.write(b"HTTP/1.1 201 Created\r\n\r\nuntil-eof body")
        await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            first = await get(pool, raw.key(), "/")
            assert (first.status, first.body) == (200, b"ok")
            second = await get(pool, raw.key(), "/")  # Connection: close -> a new connection
            assert (second.status, second.body) == (201, b"until-eof body")
            assert raw.connections == 2
            await asyncio.sleep(0.05)
            assert pool.stats()["open"] == 0  # an EOF-delimited body is never reused

    run(main)


def test_an_interim_response_with_a_body_is_malformed_not_glued_to_the_answer() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 150 X\r\nContent-Length: 9\r\n\r\nINTERIM!!"
                     b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal")
        await writer.drain()
        await reader.read()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            # its body used to be read as the start of the 200's ("INTERIM!!real")
            with pytest.raises(ProtocolError, match="1xx interim response with a body"):
                await get(pool, raw.key(), "/")
            for _ in range(100):  # closed: wait for it, up to 5 s
                if not pool.stats()["open"]:
                    break
                await asyncio.sleep(0.05)
            assert pool.stats()["open"] == 0

    run(main)


# --- failures ----------------------------------------------------------------------------------

def test_server_closing_idle_keep_alive_connection_then_next_request_succeeds() -> None:
    async def main() -> None:
        async with web_server(keepalive_timeout=0.1) as srv, H1Pool() as pool:
            assert (await get(pool, srv.key(), "/ok")).status == 200
            await asyncio.sleep(0.4)  # the server closes the idle connection
            assert (await get(pool, srv.key(), "/ok")).status == 200
            assert len(srv.peers) == 2

    run(main)


def test_a_written_request_on_a_reused_connection_is_never_sent_again() -> None:
    """A server that reads a request on a kept-alive connection and closes it unanswered
    may have acted on it: the request is not sent again behind the caller's back (the
    agent records one attempt per request it sends); the failure is the caller's, and the
    next request goes out on a fresh connection."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        await read_request(reader, raw)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader, raw)  # the second request on this connection:
        await asyncio.sleep(0.05)  # held a moment, then dropped unanswered

    async def main() -> None:
        async with raw_server(script) as r, H1Pool() as pool:
            assert (await get(pool, r.key(), "/")).status == 200
            with pytest.raises(ServerDisconnected) as err:
                await get(pool, r.key(), "/")
            assert not err.value.received
            assert (r.connections, r.requests) == (1, 2)  # not sent a third time
            assert (await get(pool, r.key(), "/")).status == 200  # a fresh connection
            assert (r.connections, r.requests) == (2, 3)

    run(main)


def test_fresh_connection_closed_without_response_is_not_resent() -> None:
    async def script(reader: asyncio.StreamReader, _w: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            with pytest.raises(ServerDisconnected) as err:
                await get(pool, raw.key(), "/")
            assert not err.value.received and raw.connections == 1

    run(main)


def test_close_in_the_middle_of_a_body_is_an_error_not_a_response() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            with pytest.raises(ServerDisconnected) as err:
                await get(pool, raw.key(), "/")
            assert err.value.received and raw.connections == 1

    run(main)


@pytest.mark.parametrize("opening, repeat", [
    (b"HTTP/1.1 200 OK\r\nX-Flood: ", b"a" * 65536),  # one header value without end
    (b"", b"HTTP/1.1 100 Continue\r\nX-Pad: " + b"b" * 4000 + b"\r\n\r\n"),  # 1xx forever
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Trailer: ",
     b"c" * 65536),  # a trailer without end, after the body
])
def test_a_response_head_without_end_is_cut_off(opening: bytes, repeat: bytes) -> None:
    """A hostile receiver streaming a head that never ends: the parser gathers one header
    value by concatenation (quadratic, and the agent's one event loop with it), so the
    client gives up once the head passes ``HEAD_LIMIT``, long before any deadline."""
    sent = [0]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(opening)
        try:
            while sent[0] < 64 * 1024 * 1024:  # bounded: 64 MiB at most
                writer.write(repeat)
                sent[0] += len(repeat)
                await writer.drain()
        except ConnectionError:
            return  # the client hung up: what it should do

    async def main() -> None:
        async with raw_server(script) as raw, H1Pool() as pool:
            with pytest.raises(ProtocolError,
                               match=r"response (head|framing|trailers or chunk framing) over"):
                await asyncio.wait_for(get(pool, raw.key(), "/"), 20)
            assert raw.connections == 1
            # the server's count includes what the two sockets' buffers took (some MiB
            # here); without the limit the client read all 64 MiB the server would send
            assert sent[0] < 32 * 1024 * 1024, f"{sent[0]} bytes of head sent before the cut"

    run(main)


def test_timeout_on_a_slow_handler() -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            with pytest.raises(TimeoutError):
                await get(pool, srv.key(), "/slow?s=0.6", timeout_s=0.2)
            assert (await get(pool, srv.key(), "/ok")).status == 200
            assert len(srv.peers) == 2  # the timed-out connection was dropped

    run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused() -> None:
    async def main() -> None:
        async with H1Pool() as pool:
            with pytest.raises(ConnectError) as err:
                await get(pool, PoolKey("http", "127.0.0.1", _free_port(), None), "/")
            assert isinstance(err.value.__cause__, ConnectionRefusedError)
            assert pool.stats() == {"open": 0, "idle": 0}

    run(main)


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [("POST", "/x", {"x-a": "1\r\nX-Injected: 1"}), ("POST", "/x y", {}),
     ("POST", "/x\r\n", {}), ("PO ST", "/x", {}), ("POST", "/x", {"x\r\nA": "b"})],
)
def test_request_splitting_is_refused(method: str, target: str, headers: dict[str, str]) -> None:
    async def main() -> None:
        async with web_server() as srv, H1Pool() as pool:
            with pytest.raises(InvalidRequest):
                await pool.request(srv.key(), method, target, "h", headers, b"x")
            assert srv.requests == []

    run(main)


# --- TLS: verification on by default ---------------------------------------------------------

def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        ), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))
    return cert_path, key_path


def test_tls_verifies_certificates(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def main() -> None:
        app = web.Application()
        async def ok(_: web.Request) -> web.Response:
            return web.Response(text="tls ok")

        app.add_routes([web.get("/ok", ok)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with H1Pool() as pool:  # the system trust store: this cert is unknown
                with pytest.raises(ConnectError) as err:
                    await pool.request(PoolKey("https", "127.0.0.1", port, "localhost"),
                                       "GET", "/ok", "localhost", {})
                assert isinstance(err.value.__cause__, ssl.SSLCertVerificationError)
            trusting = ssl.create_default_context(cafile=str(cert))
            async with H1Pool(ssl_context=trusting) as pool:
                resp = await pool.request(PoolKey("https", "127.0.0.1", port, "localhost"),
                                          "GET", "/ok", "localhost", {})
                assert (resp.status, resp.body) == (200, b"tls ok")
                with pytest.raises(ConnectError):  # the name is checked too
                    await pool.request(PoolKey("https", "127.0.0.1", port, "other.example"),
                                       "GET", "/ok", "other.example", {})
        finally:
            await runner.cleanup()

    run(main)


def test_a_tls_receiver_ignoring_our_close_does_not_hold_the_socket(tmp_path: Path) -> None:
    """It answers with Connection: close, then neither closes nor answers our TLS close
    (it stops reading). Each such answer used to hold a socket 30 s (asyncio's default TLS
    shutdown wait): at 4 sends at a time, thousands of descriptors per endpoint."""
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    done = threading.Event()
    held: list[socket.socket] = []

    def answer(conn: socket.socket) -> None:
        tls = server_ctx.wrap_socket(conn, server_side=True)
        held.append(tls)
        data = b""
        while b"\r\n\r\n" not in data:
            data += tls.recv(4096)
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        done.wait(40)  # reads nothing more, closes nothing

    def serve() -> None:  # (once per event loop: run() runs main twice)
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def main() -> None:
        trusting = ssl.create_default_context(cafile=str(cert))
        async with H1Pool(ssl_context=trusting) as pool:
            resp = await pool.request(PoolKey("https", "127.0.0.1", port, "localhost"),
                                      "GET", "/", "localhost", {})
            assert (resp.status, resp.body) == (200, b"ok")
            start = time.monotonic()
            for _ in range(150):  # up to 15 s
                if not pool.stats()["open"]:
                    break
                await asyncio.sleep(0.1)
            assert pool.stats()["open"] == 0, "the socket is still held"
            assert time.monotonic() - start < TLS_SHUTDOWN_S + 5

    try:
        run(main)
    finally:
        done.set()
        thread.join(5)
        for t in held:
            t.close()
        listener.close()


# --- through HttpTransport ---------------------------------------------------------------------

def _req(url: str) -> RenderedRequest:
    return RenderedRequest(method="POST", url=url, headers={"content-type": "application/json"},
                           body=b'{"id":"dlv_1"}')


def test_transport_maps_timeout_refused_and_retry_after() -> None:
    async def main() -> None:
        async with web_server() as srv, HttpTransport(timeout_s=0.2, allow_loopback=True) as t:
            slow = await t.send(_req(f"http://127.0.0.1:{srv.port}/slow?s=0.6"))
            assert slow.http.error_class == "timeout" and slow.blocked is None
            busy = await t.send(_req(f"http://127.0.0.1:{srv.port}/busy"))
            assert (busy.http.status, busy.http.retry_after_s) == (503, 7.0)
            gone = await t.send(_req(f"http://127.0.0.1:{_free_port()}/"))
            assert gone.http.error_class == "connection_error" and gone.blocked is None

    run(main)


def test_transport_deadline_ends_a_slow_exchange_within_a_tick_and_leaves_nothing_armed() -> None:
    async def main() -> None:
        async with web_server() as srv, HttpTransport(timeout_s=0.2, allow_loopback=True) as t:
            loop = asyncio.get_running_loop()
            started = loop.time()
            slow, ok = await asyncio.gather(
                t.send(_req(f"http://127.0.0.1:{srv.port}/slow?s=1.5")),
                t.send(_req(f"http://127.0.0.1:{srv.port}/ok")))
            took = loop.time() - started
            assert slow.http.error_class == "timeout" and ok.http.status == 200
            # the deadline (+ a 20-ms tick), not the 1.5 s; loop.time() can land a float ulp
            # short of 0.2 (CI: 0.1999999999998181)
            assert 0.2 - 1e-3 <= took < 1.0, took
            assert not t._deadlines.live  # every exchange's deadline is disarmed
            await asyncio.sleep(0.1)
            assert t._deadlines.ticker is None  # no sweep while nothing is in flight
            for _ in range(50):  # many quick exchanges: none left behind, none timed out
                r = await t.send(_req(f"http://127.0.0.1:{srv.port}/ok"))
                assert r.http.status == 200
            assert not t._deadlines.live

    run(main)


def test_transport_cancelled_by_its_caller_stays_cancelled() -> None:
    async def main() -> None:
        async with web_server() as srv, HttpTransport(timeout_s=5, allow_loopback=True) as t:
            url = f"http://127.0.0.1:{srv.port}/slow?s=3"
            task = asyncio.create_task(t.send(_req(url)))
            await asyncio.sleep(0.2)
            task.cancel()  # before the deadline: not a timeout
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not t._deadlines.live

            task = asyncio.create_task(t.send(_req(url)))
            await asyncio.sleep(0.2)
            (deadline,) = t._deadlines.live
            assert t._deadlines.ticker is not None
            t._deadlines.ticker.cancel()  # the sweep is run by hand below
            deadline.at = 0.0  # due now ...
            t._deadlines._expire_due()  # ... the sweep cancels it,
            task.cancel()  # and so does its caller in the same tick: the caller wins
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not t._deadlines.live and task.cancelling() == 1  # the sweep's cancel taken back

    run(main)


def test_transport_deadline_covers_name_resolution_and_leaves_the_task_uncancelled() -> None:
    async def slow_dns(host: str) -> list[str]:
        await asyncio.sleep(3)
        return ["127.0.0.1"]

    async def main() -> None:
        async with HttpTransport(timeout_s=0.2, allow_loopback=True, lookup=slow_dns) as t:
            loop = asyncio.get_running_loop()
            started = loop.time()
            r = await t.send(_req("http://slow-dns.example/x"))
            assert r.http.error_class == "timeout" and loop.time() - started < 1.0
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0  # as asyncio.timeout leaves it
            await asyncio.sleep(0.05)  # and no stray cancellation arrives later

    run(main)


def test_transport_resolves_names_and_reuses_connections() -> None:
    async def main() -> None:
        async with web_server() as srv, HttpTransport(timeout_s=5, allow_loopback=True) as t:
            # "localhost" may resolve to ::1 first (nothing listens there): the next
            # vetted address is tried when connecting fails.
            for _ in range(5):
                r = await t.send(_req(f"http://localhost:{srv.port}/ok"))
                assert (r.http.status, r.body) == (200, b"ok")
            assert len(srv.peers) == 1
            assert srv.requests[0][2]["host"] == f"localhost:{srv.port}"

    run(main)


def test_connections_are_shared_per_origin_not_per_address() -> None:
    """Two endpoints whose names resolve to one address (two tenants behind one front end)
    used to share plain-http connections: a front end routing a connection by its first
    request handed the second tenant's signed requests to the first one's backend."""
    async def same_address(host: str) -> list[str]:
        return ["127.0.0.1"]

    async def main() -> None:
        async with web_server() as srv, HttpTransport(timeout_s=5, allow_loopback=True,
                                                      lookup=same_address) as t:
            for _ in range(3):
                for name in ("tenant-a.example", "tenant-b.example"):
                    r = await t.send(_req(f"http://{name}:{srv.port}/ok"))
                    assert r.http.status == 200
            assert len(srv.peers) == 2  # one connection per origin, each reused
            hosts_by_peer: dict[tuple[str, int], set[str]] = {}
            assert len(srv.requests) == 6
            for peer, (_m, _p, headers, _b) in zip(srv.peer_log, srv.requests, strict=True):
                hosts_by_peer.setdefault(peer, set()).add(headers["host"])
            assert all(len(h) == 1 for h in hosts_by_peer.values()), hosts_by_peer

    run(main)


def test_a_send_waiting_for_the_clients_limit_says_how_long() -> None:
    """The wait for one of the client's requests in flight is other endpoints' time: the
    agent leaves it out of the endpoint's pace (a fast endpoint behind slow ones' requests
    looked slow, went over its budget and into quarantine)."""
    async def main() -> None:
        async with web_server() as srv, HttpTransport(timeout_s=5, allow_loopback=True,
                                                      limit=1) as t:
            slow, fast = await asyncio.gather(
                t.send(_req(f"http://127.0.0.1:{srv.port}/slow?s=0.5")),
                t.send(_req(f"http://127.0.0.1:{srv.port}/ok")))
            assert slow.http.status == fast.http.status == 200
            assert slow.queued_s == 0.0
            assert 0.4 < fast.queued_s < 2.0, fast.queued_s
            assert fast.wire_ms < 400  # its own exchange, not the wait

    run(main)


def test_a_cancel_arriving_with_the_connect_bound_is_not_taken_for_it() -> None:
    """The caller's deadline (a cancel) and the connect bound fire in the same turn of the
    loop: the send must end, cancelled. Taken for the bound's expiry, it became a
    ConnectError, and the next address was tried with no deadline left at all."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        async def connect_stalls(*_a: object, **_k: object) -> None:
            loop.call_later(0.01, task.cancel)  # the caller's deadline, and then the loop
            time.sleep(0.15)  # noqa: ASYNC251 (blocked past it and the bound: both fire at once)
            await asyncio.sleep(10)

        loop.create_connection = connect_stalls  # type: ignore[method-assign, assignment]
        pool = H1Pool()
        with pytest.raises(asyncio.CancelledError):
            await pool.request(PoolKey("http", "127.0.0.1", 9, None), "POST", "/", "x", {},
                               b"{}", connect_timeout_s=0.05)
        await pool.close()

    asyncio.run(main())
