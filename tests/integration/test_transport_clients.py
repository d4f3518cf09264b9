"""HttpTransport over each wire (``h1``, ``aiohttp``, ``httpx``) against a real receiver on
127.0.0.1: the semantics the agent relies on are the same whichever client sends.

Each test runs under uvloop (what the agent runs). Traffic only ever goes to 127.0.0.1.
Needs no Kafka or PostgreSQL.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import uvloop
from aiohttp import web

from postbacks.core.classify import HttpResult
from postbacks.core.render import RenderedRequest
from postbacks.errors import ConfigError
from postbacks.settings import load_settings
from postbacks.transport.clients import open_wire
from postbacks.transport.h1 import ConnectError, PoolKey
from postbacks.transport.http import BODY_BYTES, EXCERPT_BYTES, HttpTransport
from postbacks.transport.wire import CLIENTS

BIG = b"accepted:" + b"x" * (BODY_BYTES + 10_000)

pytestmark = pytest.mark.parametrize("client", CLIENTS)


@dataclass
class Receiver:
    port: int = 0
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    peers: set[tuple[str, int]] = field(default_factory=set)
    held: asyncio.Event = field(default_factory=asyncio.Event)  # set on teardown

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()

    @web.middleware
    async def record(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        assert request.transport is not None
        rec.peers.add(request.transport.get_extra_info("peername"))
        headers = {str(k).lower(): v for k, v in request.headers.items()}
        rec.seen.append((request.method, request.path_qs, headers, await request.read()))
        return await handler(request)

    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=BIG)

    async def busy(_: web.Request) -> web.Response:
        return web.Response(status=503, text="busy", headers={"Retry-After": "7"})

    async def hang(_: web.Request) -> web.Response:
        await rec.held.wait()
        return web.Response(text="late")

    async def moved(_: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "/landing"})

    app = web.Application(middlewares=[record])
    app.add_routes([web.post("/ok", ok), web.post("/busy", busy), web.post("/hang", hang),
                    web.post("/moved", moved), web.route("*", "/landing", ok)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    rec.port = runner.addresses[0][1]
    try:
        yield rec
    finally:
        rec.held.set()
        await runner.cleanup()


def _post(url: str, **headers: str) -> RenderedRequest:
    return RenderedRequest("POST", url, {"content-type": "application/json", **headers},
                           b'{"id":"dlv_1"}')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(main: Callable[[], Awaitable[None]]) -> None:
    async def wrapped() -> None:
        await main()

    uvloop.run(wrapped())


def test_200_with_body_on_one_kept_alive_connection(client: str) -> None:
    async def main() -> None:
        async with receiver() as rec, HttpTransport(timeout_s=5, allow_loopback=True,
                                                    client=client) as t:
            first = await t.send(_post(rec.url("/ok"), **{"webhook-id": "msg_1"}))
            second = await t.send(_post(rec.url("/ok")))
        for result in (first, second):
            assert result.http == HttpResult(200, None, None) and result.blocked is None
            assert result.body == BIG[:BODY_BYTES]
            assert result.excerpt == BIG[:EXCERPT_BYTES]
        method, path, headers, body = rec.seen[0]
        assert (method, path, body) == ("POST", "/ok", b'{"id":"dlv_1"}')
        assert headers["host"] == f"127.0.0.1:{rec.port}"
        assert headers["webhook-id"] == "msg_1"
        assert headers["content-type"] == "application/json"
        assert headers["user-agent"].startswith("postbacks/")
        assert len(rec.peers) == 1  # the second request reused the connection

    run(main)


def test_5xx_with_retry_after(client: str) -> None:
    async def main() -> None:
        async with receiver() as rec, HttpTransport(timeout_s=5, allow_loopback=True,
                                                    client=client) as t:
            result = await t.send(_post(rec.url("/busy")))
        assert result.http == HttpResult(503, None, 7.0)
        assert result.body == b"busy"

    run(main)


def test_a_receiver_that_never_answers_is_a_timeout(client: str) -> None:
    async def main() -> None:
        async with receiver() as rec, HttpTransport(timeout_s=0.3, allow_loopback=True,
                                                    client=client) as t:
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await t.send(_post(rec.url("/hang")))
            took = loop.time() - started
            after = await t.send(_post(rec.url("/ok")))  # the wire is still usable
        assert result.http == HttpResult(None, "timeout") and result.blocked is None
        assert 0.3 <= took < 2.0, took
        assert after.http.status == 200

    run(main)


def test_connection_refused_is_a_connection_error(client: str) -> None:
    async def main() -> None:
        port = _free_port()
        async with HttpTransport(timeout_s=5, allow_loopback=True, client=client) as t:
            result = await t.send(_post(f"http://127.0.0.1:{port}/ok"))
        assert result.http == HttpResult(None, "connection_error") and result.blocked is None
        wire = open_wire(client, limit=4, idle_timeout_s=5)
        try:
            with pytest.raises(ConnectError):
                await wire.request(PoolKey("http", "127.0.0.1", port, None), "POST", "/ok",
                                   f"127.0.0.1:{port}", {}, b"{}")
        finally:
            await wire.close()

    run(main)


def test_a_redirect_is_returned_not_followed(client: str) -> None:
    async def main() -> None:
        async with receiver() as rec, HttpTransport(timeout_s=5, allow_loopback=True,
                                                    client=client) as t:
            result = await t.send(_post(rec.url("/moved")))
            followed = await t.send(_post(rec.url("/moved")), follow_redirects=True)
        assert result.http.status == 302
        assert followed.http.status == 200  # followed by HttpTransport, vetted hop by hop
        assert [(m, p) for m, p, _, _ in rec.seen] == [
            ("POST", "/moved"), ("POST", "/moved"), ("GET", "/landing")]

    run(main)


def test_header_injection_is_refused_unsent(client: str) -> None:
    async def main() -> None:
        async with receiver() as rec, HttpTransport(timeout_s=5, allow_loopback=True,
                                                    client=client) as t:
            result = await t.send(_post(rec.url("/ok"), **{"x-note": "a\r\nx-evil: 1"}))
        assert result.http == HttpResult(None, "invalid_request")
        assert rec.seen == []

    run(main)


def test_the_setting_names_the_client(client: str) -> None:
    assert load_settings({"POSTBACKS_HTTP_CLIENT": client}).http_client == client
    with pytest.raises(ConfigError, match="POSTBACKS_HTTP_CLIENT"):
        load_settings({"POSTBACKS_HTTP_CLIENT": f"{client}2"})


def test_an_address_that_drops_connects_gives_way_to_the_next(client: str) -> None:
    """The name's first address never answers a connect (a listener whose accept queue is
    full drops every SYN, as a dead host or a broken route does); the next address works.
    The first send goes to the second address once its share of the timeout has passed,
    not at the timeout's end; the next sends try the silent address last and do not wait."""
    from postbacks.transport import http

    async def main() -> None:
        async with receiver() as rec:
            silent = socket.socket()
            silent.bind(("127.0.0.2", rec.port))
            silent.listen(0)
            filler = socket.create_connection(("127.0.0.2", rec.port), timeout=1)
            asked: list[str] = []

            async def lookup(host: str) -> list[str]:
                asked.append(host)
                return ["127.0.0.2", "127.0.0.1"]

            try:
                async with HttpTransport(timeout_s=3, allow_loopback=True, client=client,
                                         lookup=lookup) as t:
                    loop = asyncio.get_running_loop()
                    took = []
                    results = []
                    for _ in range(3):
                        started = loop.time()
                        results.append(await t.send(_post(f"http://hooks.example:{rec.port}/ok")))
                        took.append(loop.time() - started)
            finally:
                filler.close()
                silent.close()
        assert [r.http for r in results] == [HttpResult(200, None, None)] * 3, results
        assert [seen[0] for seen in rec.seen] == ["POST"] * 3
        share = min(http.CONNECT_EACH_S, 3 / 2)  # the timeout shared by two addresses
        assert share * 0.9 <= took[0] < 2.9, took
        assert max(took[1:]) < 0.5, took
        assert asked == ["hooks.example"]

    run(main)


def test_a_connect_unanswered_past_its_bound_is_a_connect_error(client: str) -> None:
    async def main() -> None:
        silent = socket.socket()
        silent.bind(("127.0.0.2", 0))
        silent.listen(0)
        port = silent.getsockname()[1]
        filler = socket.create_connection(("127.0.0.2", port), timeout=1)
        wire = open_wire(client, limit=4, idle_timeout_s=5)
        try:
            started = asyncio.get_running_loop().time()
            with pytest.raises(ConnectError, match=r"cannot connect to 127\.0\.0\.2"):
                await wire.request(PoolKey("http", "127.0.0.2", port, None), "POST", "/ok",
                                   f"127.0.0.2:{port}", {}, b"{}", connect_timeout_s=0.3)
            assert asyncio.get_running_loop().time() - started < 2.0
        finally:
            await wire.close()
            filler.close()
            silent.close()

    run(main)


def test_a_non_ascii_header_value_is_sent_as_utf8_by_every_client(client: str) -> None:
    """A header value saved before the console refused non-ASCII values: h1 and aiohttp
    sent it as UTF-8, httpx refused it (UnicodeEncodeError, recorded as a permanent
    ``invalid_url``). Every client now sends the same bytes."""
    async def main() -> None:
        async with receiver() as rec, HttpTransport(timeout_s=5, allow_loopback=True,
                                                    client=client) as t:
            result = await t.send(_post(rec.url("/ok"), **{"x-note": "ключ é"}))
        assert result.http == HttpResult(200, None, None), result
        [(_, _, headers, _)] = rec.seen
        assert headers["x-note"] == "ключ é"

    run(main)
