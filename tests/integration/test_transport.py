"""The HTTP transport against a real receiver on 127.0.0.1 (real sockets, no mocks).

Every refusal is proven on the receiver's side too: a refused send must leave it with zero
requests. Traffic only ever goes to 127.0.0.1; the internal redirect targets
(169.254.169.254, 10.0.0.1) must be refused before any connect, so they are never reached.
Needs no Kafka or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from postbacks.core.classify import HttpResult, Permanent, classify
from postbacks.core.render import RenderedRequest
from postbacks.transport.http import BODY_BYTES, EXCERPT_BYTES, HttpTransport, SendResult

BIG = b"x" * (BODY_BYTES + 10_000)
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    body: bytes


@dataclass
class Receiver:
    port: int
    seen: list[Seen] = field(default_factory=list)

    def url(self, path: str = "/ok", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def _redirect_to(status: int, location: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(status=status, headers={"Location": location})

    return handler


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    """A scripted receiver on 127.0.0.1 (ephemeral port) that records every request."""
    rec = Receiver(port=0)

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        rec.seen.append(Seen(request.method, request.path, await request.read()))
        return await handler(request)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=b"accepted:" + BIG)

    async def loop(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        return await _redirect_to(307, f"/loop/{n + 1}")(request)

    async def to(request: web.Request) -> web.Response:  # a 307 to ?u=
        return await _redirect_to(307, request.query["u"])(request)

    routes = [
        web.route("*", "/ok", ok),
        web.route("*", "/to", to),
        web.route("*", "/landing", ok),
        web.route("*", "/to-metadata",
                  _redirect_to(302, "http://169.254.169.254/latest/meta-data")),
        web.route("*", "/to-private", _redirect_to(302, "http://10.0.0.1/")),
        web.route("*", "/to-hex-metadata", _redirect_to(307, "http://0xa9fea9fe/")),
        web.route("*", "/moved", _redirect_to(302, "/landing")),
        web.route("*", "/to-bad-name", _redirect_to(302, "http://xn--/")),
        web.route("*", "/loop/{n}", loop),
    ]
    app = web.Application(middlewares=[record])
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.port = runner.addresses[0][1]
    try:
        yield rec
    finally:
        await runner.cleanup()


def _post(url: str, body: bytes = b'{"id":"dlv_1"}') -> RenderedRequest:
    return RenderedRequest(
        method="POST", url=url, headers={"content-type": "application/json"}, body=body
    )


async def _send(
    url_for: Callable[[Receiver], str], *, allow_loopback: bool, **kw: object
) -> tuple[SendResult, Receiver]:
    async with receiver() as rec, HttpTransport(
        timeout_s=TIMEOUT_S, allow_loopback=allow_loopback
    ) as transport:
        result = await transport.send(_post(url_for(rec)), **kw)  # type: ignore[arg-type]
        return result, rec


def _assert_blocked(result: SendResult) -> None:
    assert result.http.status is None
    assert result.http.error_class == "blocked_address"
    assert result.blocked
    assert result.excerpt is None and result.body is None


# (a) loopback in every form is refused, and nothing reaches the receiver --------------------

@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]",
     "[::ffff:7f00:1]", "127.0.0.1.", "%31%32%37.0.0.1", "localhost"],
)
def test_loopback_forms_are_refused_before_connecting(host: str) -> None:
    result, rec = asyncio.run(_send(lambda r: r.url(host=host), allow_loopback=False))
    _assert_blocked(result)
    assert rec.seen == []


def test_localhost_is_refused_by_the_vetting_resolver() -> None:
    result, rec = asyncio.run(_send(lambda r: r.url(host="localhost"), allow_loopback=False))
    _assert_blocked(result)
    assert result.blocked is not None and "localhost: refused" in result.blocked
    assert rec.seen == []


@pytest.mark.parametrize("url", ["http://[::1:{port}/", "http://127.0.0.1:99999/",
                                 # names IDNA refuses: they used to raise out of send()
                                 "https://a..b.example.com/cb",
                                 "https://" + "a" * 64 + ".example.com/cb",
                                 "https://xn--zz-.example.com/cb"])
def test_unparseable_url_is_a_permanent_invalid_url(url: str) -> None:
    result, rec = asyncio.run(_send(lambda r: url.format(port=r.port), allow_loopback=True))
    assert result.http == HttpResult(None, "invalid_url")
    assert result.blocked is not None
    assert rec.seen == []


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:{port}/", "http://evil@127.0.0.1:{port}/ok"])
def test_bad_scheme_and_userinfo_are_refused(url: str) -> None:
    result, rec = asyncio.run(_send(lambda r: url.format(port=r.port), allow_loopback=True))
    _assert_blocked(result)
    assert rec.seen == []


# (b) loopback allowed: a real delivery ---------------------------------------------------

def test_loopback_allowed_delivers() -> None:
    result, rec = asyncio.run(_send(lambda r: r.url(), allow_loopback=True))
    assert result.http.status == 200 and result.blocked is None
    assert result.body is not None and len(result.body) == BODY_BYTES
    assert result.body.startswith(b"accepted:")
    assert result.excerpt == result.body[:EXCERPT_BYTES]
    assert result.wire_ms > 0
    assert rec.seen == [Seen("POST", "/ok", b'{"id":"dlv_1"}')]


# (c) a redirect to an internal address is refused before any connect ----------------------

@pytest.mark.parametrize(
    ("path", "reason"),
    [("/to-metadata", "link-local"), ("/to-private", "private"),
     ("/to-hex-metadata", "link-local")],
)
def test_redirect_to_internal_address_is_refused(path: str, reason: str) -> None:
    result, rec = asyncio.run(
        _send(lambda r: r.url(path), allow_loopback=True, follow_redirects=True)
    )
    _assert_blocked(result)
    assert result.blocked is not None and reason in result.blocked
    assert result.wire_ms < TIMEOUT_S * 1000 / 2  # refused, not timed out connecting
    assert [s.path for s in rec.seen] == [path]


def test_redirect_to_a_name_idna_refuses_is_a_permanent_invalid_url() -> None:
    result, rec = asyncio.run(
        _send(lambda r: r.url("/to-bad-name"), allow_loopback=True, follow_redirects=True))
    assert result.http == HttpResult(None, "invalid_url"), result
    assert [s.path for s in rec.seen] == ["/to-bad-name"]


# (d) redirects are not followed unless asked ----------------------------------------------

def test_redirect_is_returned_as_is_by_default() -> None:
    result, rec = asyncio.run(_send(lambda r: r.url("/to-metadata"), allow_loopback=True))
    assert result.http.status == 302 and result.blocked is None
    assert classify(result.http) == Permanent("http_302")
    assert [s.path for s in rec.seen] == ["/to-metadata"]


# (e) a 307 chain longer than max_redirects stops, permanently ------------------------------

def test_redirect_chain_longer_than_the_limit_stops() -> None:
    result, rec = asyncio.run(_send(
        lambda r: r.url("/loop/0"), allow_loopback=True, follow_redirects=True, max_redirects=3
    ))
    assert result.http.status == 307
    assert classify(result.http) == Permanent("http_307")
    assert [s.path for s in rec.seen] == ["/loop/0", "/loop/1", "/loop/2", "/loop/3"]
    assert {(s.method, s.body) for s in rec.seen} == {("POST", b'{"id":"dlv_1"}')}


# (f) a 302 on POST to the same loopback server is followed as a GET ------------------------

def test_302_on_post_is_followed_as_get_without_body() -> None:
    result, rec = asyncio.run(
        _send(lambda r: r.url("/moved"), allow_loopback=True, follow_redirects=True)
    )
    assert result.http.status == 200 and result.blocked is None
    assert result.excerpt is not None and result.excerpt.startswith(b"accepted:")
    assert rec.seen == [Seen("POST", "/moved", b'{"id":"dlv_1"}'), Seen("GET", "/landing", b"")]


# a hostname whose DNS answer is a private or metadata address --------------------------------

@pytest.mark.parametrize("answer", [["10.1.2.3"], ["169.254.169.254"], ["192.168.0.7", "fd00::1"],
                                    ["::ffff:10.0.0.1"]])
def test_a_hostname_resolving_to_a_private_address_is_refused(answer: list[str]) -> None:
    """The DNS seam answers with an internal address (as a rebinding or split-horizon DNS
    would); the guard refuses before any connect, so the address is never contacted."""
    asked: list[str] = []

    async def dns(host: str) -> list[str]:
        asked.append(host)
        return answer

    async def go() -> SendResult:
        async with HttpTransport(timeout_s=TIMEOUT_S, allow_loopback=True,
                                 lookup=dns) as transport:
            return await transport.send(_post("http://publisher.example/hook"))

    result = asyncio.run(go())
    _assert_blocked(result)
    assert asked == ["publisher.example"]
    assert "publisher.example: refused" in (result.blocked or "")


def test_a_redirect_to_another_origin_carries_no_custom_or_credential_header() -> None:
    got: list[dict[str, str]] = []

    async def run() -> None:
        async def land(request: web.Request) -> web.Response:
            got.append(dict(request.headers))
            return web.Response(text="ok")

        other = web.Application()
        other.add_routes([web.route("*", "/landing", land)])
        runner = web.AppRunner(other)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        there = f"http://127.0.0.1:{runner.addresses[0][1]}/landing"
        try:
            async with receiver() as rec, HttpTransport(timeout_s=TIMEOUT_S,
                                                        allow_loopback=True) as t:
                req = RenderedRequest("POST", rec.url(f"/to?u={there}"), {
                    "content-type": "application/json", "X-Api-Key": "k-live",
                    "Authorization": "Bearer b", "webhook-id": "msg_1",
                    "x-partner-signature": "abc", "idempotency-key": "msg_1"}, b"{}")
                result = await t.send(req, follow_redirects=True)
                assert result.http.status == 200, result
        finally:
            await runner.cleanup()

    asyncio.run(run())
    assert len(got) == 1
    names = {k.lower() for k in got[0]}
    assert "x-api-key" not in names and "authorization" not in names, got
    assert {"webhook-id", "x-partner-signature", "idempotency-key", "content-type"} <= names


def test_sends_waiting_for_a_slot_behind_hanging_ones_do_not_time_out() -> None:
    """Four lanes of an endpoint that never answers keep the transport's four slots busy,
    re-sending as each send times out. Sends to a healthy endpoint wait for a slot, and
    each one's deadline starts only once it holds one: none of them times out."""

    async def run() -> collections.Counter[object]:
        holding = asyncio.Event()
        hung: list[int] = []

        async def hang(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read(65536)
            hung.append(1)
            if len(hung) >= 4:
                holding.set()
            await asyncio.sleep(5)  # the receiver that never answers in time
            w.close()

        async def fast(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read(65536)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await w.drain()
            w.close()

        bad = await asyncio.start_server(hang, "127.0.0.1", 0)
        good = await asyncio.start_server(fast, "127.0.0.1", 0)
        bad_url = f"http://127.0.0.1:{bad.sockets[0].getsockname()[1]}/"
        good_url = f"http://127.0.0.1:{good.sockets[0].getsockname()[1]}/"
        results: collections.Counter[object] = collections.Counter()
        stop = asyncio.Event()
        async with HttpTransport(timeout_s=1.0, allow_loopback=True, limit=4) as t:
            async def hostile() -> None:
                while not stop.is_set():
                    await t.send(_post(bad_url))

            async def healthy() -> None:
                for _ in range(3):
                    r = await t.send(_post(good_url))
                    results[r.http.status or r.http.error_class] += 1

            lanes = [asyncio.create_task(hostile()) for _ in range(4)]
            await asyncio.wait_for(holding.wait(), 10)  # the four hold every slot
            await asyncio.gather(*(healthy() for _ in range(3)))
            stop.set()
            await asyncio.gather(*lanes)
        for server in (bad, good):
            server.close()
        return results

    assert asyncio.run(run()) == {200: 9}


@pytest.mark.parametrize(("ttl_s", "asked"), [(5.0, 1), (0.0, 3)])
def test_a_name_that_does_not_resolve_is_not_asked_again_for_a_while(
        monkeypatch: pytest.MonkeyPatch, ttl_s: float, asked: int) -> None:
    import socket

    from postbacks.transport import resolver

    monkeypatch.setattr(resolver, "DNS_FAILED_TTL_S", ttl_s)
    calls: list[str] = []

    async def lookup(host: str) -> list[str]:
        calls.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    async def run() -> list[SendResult]:
        async with HttpTransport(timeout_s=TIMEOUT_S, allow_loopback=False,
                                 lookup=lookup) as t:
            return [await t.send(_post("https://broken-delegation.example/cb"))
                    for _ in range(3)]

    results = asyncio.run(run())
    assert [r.http.error_class for r in results] == ["connection_error"] * 3
    assert len(calls) == asked
