"""The HTTP/1.1 connection's reading limits, fed byte by byte (postbacks.transport.h1_conn):
what a hostile receiver controls is how its answer is cut into reads. A fake transport
stands in for the socket; the parser is the real one (llhttp)."""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import pytest

from postbacks.transport.h1 import H1Pool
from postbacks.transport.h1_conn import HEAD_LIMIT, H1Response, PoolKey, ProtocolError, _Conn, _Slot


class _Socketless:
    """A transport that takes writes and reports no socket."""

    def __init__(self) -> None:
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def abort(self) -> None:
        self.closing = True

    close = abort


def _answer(reads: list[bytes], *, then_close: bool = False,
            peak: list[int] | None = None) -> H1Response | BaseException | None:
    """The response a connection makes of ``reads``, fed one by one (None: not complete),
    the receiver closing cleanly after them if ``then_close``; ``peak`` gets the most
    memory allocated while they were read."""
    async def main() -> H1Response | BaseException | None:
        pool = H1Pool()
        conn = _Conn(pool, _Slot(PoolKey("http", "127.0.0.1", 80, None)))
        conn.connection_made(_Socketless())  # type: ignore[arg-type]
        fut = conn.send(b"POST / HTTP/1.1\r\n\r\n", False)
        if peak is not None:
            tracemalloc.start()
        try:
            for data in reads:
                if fut.done():
                    break
                conn.data_received(data)
            if then_close:
                conn.connection_lost(None)
            if peak is not None:
                peak.append(tracemalloc.get_traced_memory()[1])
        finally:
            if peak is not None:
                tracemalloc.stop()
        if not fut.done():
            return None
        exc = fut.exception()
        return exc if exc is not None else fut.result()

    return asyncio.run(main())


def test_a_body_dripped_a_byte_per_read_is_kept_in_one_buffer() -> None:
    """64 KiB of body in 32,768 reads: kept as one buffer, not one object per read (that
    took about 90 times the body's size, per response in flight)."""
    body = bytes(range(256)) * 256
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    reads = [head] + [body[i:i + 2] for i in range(0, len(body), 2)]
    peak: list[int] = []
    got = _answer(reads, peak=peak)
    assert isinstance(got, H1Response) and got.body == body
    assert peak[0] < 4 * len(body), peak


def test_a_head_over_the_limit_is_refused_however_it_is_read() -> None:
    """A head over 64 KiB that arrives whole in one read, body and all, is refused as one
    that arrives in many (it used to pass when one read carried all of it)."""
    head = b"HTTP/1.1 200 OK\r\n" + (b"X-Pad: " + b"p" * 1000 + b"\r\n") * 100
    whole = head + b"Content-Length: 2\r\n\r\nok"
    assert len(head) > HEAD_LIMIT
    for reads in ([whole], [whole[i:i + 4096] for i in range(0, len(whole), 4096)]):
        got = _answer(reads)
        assert isinstance(got, ProtocolError) and "head over" in str(got), got
    under = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * 60_000 + b"\r\nContent-Length: 2\r\n\r\nok"
    got = _answer([under])
    assert isinstance(got, H1Response) and got.body == b"ok"


def test_a_status_line_over_the_limit_is_refused_in_one_read() -> None:
    got = _answer([b"HTTP/1.1 200 " + b"O" * (HEAD_LIMIT + 10) + b"\r\nContent-Length: 0\r\n\r\n"])
    assert isinstance(got, ProtocolError), got


@pytest.mark.parametrize("coding, chunked", [
    (b"chunked", True), (b"CHUNKED", True), (b"chunked  ", True), (b"gzip, chunked", True),
    (b"gzip,\tchunked", True), (b"\tchunked", True),
    (b"chunked\t", False), (b"chunked \t", False), (b"gzip, chunked\t", False),
    (b"chunked, gzip", False), (b"xchunked", False),
])
def test_transfer_encoding_frames_the_body_as_llhttp_reads_it(coding: bytes,
                                                              chunked: bool) -> None:
    """Where the client's framing and llhttp's disagreed (a tab after ``chunked``), a
    complete 200 closed cleanly was taken for a dropped connection on every attempt."""
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + coding + b"\r\n\r\n2\r\nok\r\n0\r\n\r\n"
    if chunked:
        got = _answer([answer])
        assert isinstance(got, H1Response) and got.body == b"ok", got
    else:  # the body runs to the end of the connection, framing bytes and all
        assert _answer([answer]) is None
        got = _answer([answer], then_close=True)
        assert isinstance(got, H1Response) and got.body == b"2\r\nok\r\n0\r\n\r\n", got


def test_headers_and_trailers_each_have_the_limit() -> None:
    """40 KiB of headers and 30 KiB of trailers: each under its own 64 KiB, a 200."""
    pad = b"X-Pad: " + b"p" * 1000 + b"\r\n"
    answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + pad * 40 + b"\r\n"
              + b"2\r\nok\r\n0\r\n" + pad.replace(b"X-Pad", b"X-Trailer") * 30 + b"\r\n")
    got = _answer([answer])
    assert isinstance(got, H1Response) and got.body == b"ok", got


def test_a_close_from_the_server_makes_an_idle_connection_not_quiet() -> None:
    """A close received but not yet seen by the event loop leaves nothing for FIONREAD to
    count: the request written on that connection was lost (and, re-sent, sent twice)."""
    import socket

    async def main() -> tuple[bool, bool, bool]:
        ours, theirs = socket.socketpair()
        conn = _Conn(H1Pool(), _Slot(PoolKey("http", "127.0.0.1", 80, None)))
        conn._fd = ours.fileno()
        before = conn.quiet
        theirs.sendall(b"x")
        with_byte = conn.quiet
        ours.recv(1)
        theirs.close()
        after_close = conn.quiet
        ours.close()
        return before, with_byte, after_close

    assert asyncio.run(main()) == (True, False, False)


def test_a_body_of_tiny_chunks_is_cut_once_it_costs_the_loop_more_than_a_real_one() -> None:
    """600,000 one-byte chunks fit in the framing limit and cost the agent's event loop a
    Python call each (~0.1 s per response); past PIECE_LIMIT chunks beyond one per read
    the body is read no further and the connection closed, as past DISCARD_LIMIT, and the
    status stands (a 200 so cut is still delivered: a receiver cannot choose how its chunks
    are gathered into reads). Chunks of a real body, a few per read, are read whole."""
    from postbacks.transport.h1_conn import PIECE_LIMIT

    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    tiny = b"1\r\nX\r\n" * (PIECE_LIMIT + 10)
    got = _answer([head + tiny[:len(tiny) // 2], tiny[len(tiny) // 2:] + b"0\r\n\r\n"])
    assert isinstance(got, H1Response) and got.status == 200 and got.truncated
    assert got.body_size < PIECE_LIMIT + 10  # (one piece per read is not counted)

    # a slow server's small chunks gathered into big reads: cut, and still its 200
    small = b"40\r\n" + b"z" * 64 + b"\r\n"
    stream = small * 4800  # 300 KiB of body in 64-byte chunks, read 64 KiB at a time
    reads = [head] + [stream[i:i + 65536] for i in range(0, len(stream), 65536)]
    got = _answer([*reads, b"0\r\n\r\n"])
    assert isinstance(got, H1Response) and got.status == 200 and got.truncated

    chunk = b"400\r\n" + b"y" * 1024 + b"\r\n"  # 1 KiB chunks, 16 in each read of 16 KiB
    reads = [head] + [chunk * 16] * 60 + [b"0\r\n\r\n"]
    ok = _answer(reads)
    assert isinstance(ok, H1Response) and ok.status == 200 and ok.body_size == 60 * 16 * 1024
    assert not ok.truncated


def test_a_response_with_bare_lf_line_ends_is_read_as_other_clients_read_it() -> None:
    """RFC 9112 2.2 lets a recipient take a lone LF as a line end; aiohttp, httpx and
    http.client do. A 200 from a server that sends them was a connection_error, re-sent
    until exhausted."""
    got = _answer([b"HTTP/1.1 200 OK\nContent-Length: 2\nRetry-After: 5\n\nok"])
    assert isinstance(got, H1Response) and (got.status, got.body) == (200, b"ok")
