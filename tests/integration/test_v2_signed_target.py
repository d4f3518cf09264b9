"""A ``v2`` postback (GET, values in the URL) is signed over its request target, and the
HTTP client puts exactly that target on the request line. Before, the signature covered
the empty body only, so anyone who saw one request could send its headers with other
values; and the client let yarl rewrite the target (``/cb/%2E%2E/ok`` went out as
``/ok``, ``%3B`` as ``;``), so a signature over the rendered URL would not have matched.

A raw TCP receiver on 127.0.0.1 records the request line as it arrived. Needs no Kafka or
PostgreSQL.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from standardwebhooks import Webhook

from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.render import render
from postbacks.core.signing import decode_secret, generate_secret
from postbacks.transport.http import HttpTransport
from tests.unit.factories import make_conversion, make_delivery

SECRET = generate_secret(b"\x05" * 32)


async def _send_and_capture(template: str, snapshot: dict[str, str]) -> tuple[str, dict[str, str]]:
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines.extend(head.split(b"\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ep = Endpoint("ep_v2", "app_1", template.replace("PORT", str(port)), frozenset({"*"}),
                  provider="v2", secrets=(SigningSecret("s1", decode_secret(SECRET), 0),),
                  config=EndpointConfig.from_json({}))
    d = make_delivery(conversion=make_conversion(source_snapshot=snapshot))
    req = render(d, ep, now_ms=int(time.time() * 1000))
    async with server, HttpTransport(timeout_s=5.0, allow_loopback=True) as transport:
        result = await transport.send(req)
    assert result.http is not None and result.http.status == 200, result
    method, target, _ = lines[0].decode().split(" ")
    assert method == "GET"
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
    return target, headers


@pytest.mark.parametrize(("template", "snapshot", "sent"), [
    ("http://127.0.0.1:PORT/cb/{snapshot.a}/ok?v={snapshot.b}", {"a": "..", "b": "x;y&z/w"},
     "/cb/%2E%2E/ok?v=x%3By%26z%2Fw"),
    ("http://127.0.0.1:PORT/c/{snapshot.a}?amt={payout_usd}", {"a": "a;b", "b": "-"},
     "/c/a%3Bb?amt=1.250000"),
    ("http://127.0.0.1:PORT/a b/é?q={snapshot.a}", {"a": "v w", "b": "-"},
     "/a%20b/%C3%A9?q=v%20w"),
    ("http://127.0.0.1:PORT/a?sub[id]={snapshot.a}&p=50%off", {"a": "v", "b": "-"},
     "/a?sub%5Bid%5D=v&p=50%25off"),
])
def test_the_target_on_the_wire_is_the_target_signed(
        template: str, snapshot: dict[str, str], sent: str) -> None:
    target, headers = asyncio.run(_send_and_capture(template, snapshot))
    assert target == sent
    # the receiver's library, given the raw target as the payload, accepts it ...
    Webhook(SECRET).verify(target.encode(), headers, json_parse=False)
    # ... and refuses the same headers with another value
    with pytest.raises(Exception):  # noqa: B017 - the library's verification error
        Webhook(SECRET).verify((target + "&amt=9").encode(), headers, json_parse=False)
