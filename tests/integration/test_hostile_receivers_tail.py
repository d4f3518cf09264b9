"""A hostile receiver's tail of a response: what follows the head (a body cut by a reset,
a second response in the same read, trailers) and where its redirects point. Each case
runs against a real socket server on 127.0.0.1, under asyncio and uvloop; every wait is
bounded. Needs no Kafka or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from postbacks.core.classify import Retryable, classify
from postbacks.core.render import MAX_URL_BYTES, RenderedRequest
from postbacks.transport.http import HttpTransport, SendResult, _vet_cached
from tests.integration.test_h1 import Raw, _req, raw_server, read_request, run

WAIT_S = 5.0


def test_a_reset_cutting_a_body_delimited_by_the_close_is_a_connection_error() -> None:
    """The close delimits such a body only when it is clean (RFC 9112 8): a reset means the
    body was cut, so the attempt is retried, never taken as delivered."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"status":"ok"')
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST

    async def clean(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        await writer.drain()  # then a clean close (FIN): the body is complete

    async def main() -> None:
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"))
            assert result.http.status is None, result
            assert classify(result.http) == Retryable("connection_error")
        async with raw_server(clean) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"))
            assert (result.http.status, result.body) == (200, b"all of it"), result

    run(main)


def _answered_with(answer: bytes) -> list[SendResult]:
    """What one send gets from a receiver answering ``answer``, under asyncio and uvloop."""
    got: list[SendResult] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await reader.read()

    async def main() -> None:
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            got.append(await t.send(_req(f"http://127.0.0.1:{raw.port}/")))

    run(main)
    assert len(got) == 2
    return got


def test_a_second_response_in_the_same_read_lends_the_answer_none_of_its_headers() -> None:
    for result in _answered_with(
            b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\n"
            b"Retry-After: 3600\r\nLocation: http://169.254.169.254/\r\nContent-Length: 0"
            b"\r\n\r\n"):
        assert (result.http.status, result.http.retry_after_s) == (503, None), result


def test_trailers_are_not_taken_as_headers() -> None:
    """A trailer ``Retry-After`` (RFC 9110 6.5.1: not to be merged into the header)."""
    for result in _answered_with(b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 b"4\r\nbusy\r\n0\r\nRetry-After: 3600\r\n\r\n"):
        assert (result.http.status, result.http.retry_after_s) == (503, None), result
        assert result.body == b"busy"


def test_an_endless_trailer_is_cut_at_the_head_limit() -> None:
    """The parser gathers a trailer value split over reads by concatenation, as a header's:
    held to the head's 64 KiB, not the 4 MiB of framing a response may otherwise have."""
    sent = [0]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
                     b"X-T: ")
        with contextlib.suppress(ConnectionError):
            while sent[0] < 8 * 1024 * 1024:  # bounded
                writer.write(b"a" * 1024)
                sent[0] += 1024
                await writer.drain()
                await asyncio.sleep(0.0005)

    async def main() -> None:
        sent[0] = 0
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"))
            assert result.http.error_class == "connection_error", result
            assert loop.time() - started < WAIT_S / 2
        assert sent[0] < 1024 * 1024, sent[0]  # cut near 64 KiB, not at 4 MiB

    run(main)


def test_redirects_to_ever_longer_locations_are_refused_and_not_cached() -> None:
    """A receiver redirecting each delivery to a new, long Location: past the URL limit it
    is ``invalid_url``, and no URL longer than the cache takes stays in memory."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        while True:
            await read_request(reader, raw)
            n = raw.requests
            size = 3000 if n % 2 else MAX_URL_BYTES + 100  # under and over the URL limit
            writer.write(b"HTTP/1.1 307 Again\r\nLocation: /" + str(n).encode() + b"/"
                         + b"x" * size + b"\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        _vet_cached.cache_clear()
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            for _ in range(20):
                result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"),
                                      follow_redirects=True, max_redirects=5)
                assert result.http.error_class == "invalid_url", result
                assert "over the" in (result.blocked or ""), result.blocked
        assert _vet_cached.cache_info().currsize == 1  # the first URL only

    run(main)


def test_an_early_answer_closed_with_the_request_unread_keeps_its_status() -> None:
    """A receiver that answers from the head alone (an HTTP/1.0 410, the body delimited by
    the close) and closes with the request's body unread: the kernel resets the connection,
    but the status said all it had to say. A 2xx cut so is not proof of delivery (the test
    above); a 410 stays a 410, permanent, not a retried connection error."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _r: Raw) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head only: the body stays unread
        writer.write(b"HTTP/1.0 410 Gone\r\n\r\ngone")
        await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            for _ in range(3):
                req = _req(f"http://127.0.0.1:{raw.port}/")
                result = await t.send(RenderedRequest(req.method, req.url, req.headers,
                                                      b"x" * 200_000))
                assert result.http.status == 410, result

    run(main)


def test_a_location_the_url_parser_chokes_on_is_an_invalid_url() -> None:
    """``Location: http://][@/`` (legal header bytes) made the URL library raise
    IndexError: the send raised, and the delivery ended as an internal error with no
    attempt recorded. It is a permanent ``invalid_url``, as any Location that is no URL."""
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Raw) -> None:
        while True:
            await read_request(reader, raw)
            writer.write(b"HTTP/1.1 302 Found\r\nLocation: http://][@/\r\n"
                         b"Content-Length: 0\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        async with raw_server(script) as raw, HttpTransport(
                timeout_s=WAIT_S, allow_loopback=True) as t:
            result = await t.send(_req(f"http://127.0.0.1:{raw.port}/"),
                                  follow_redirects=True)
            assert result.http.error_class == "invalid_url", result
            assert (result.blocked or "").startswith("invalid_url: Location"), result.blocked

    run(main)
