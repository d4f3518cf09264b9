"""The console reads a form or JSON body within BODY_READ_S: a client trickling its body a
byte at a time held its connection for as long as it liked (keep-alive timeouts do not
run during a read), and one that went away mid-body raised a traceback counted as a 5xx.
A bare aiohttp app with the console's body reader and a raw socket as the client."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

import replay_console.forms as forms
from replay_console.problem import Problem


async def _handler(request: web.Request) -> web.Response:
    try:
        return web.json_response(await forms.body_of(request))
    except Problem as p:
        return web.json_response({"error": str(p)}, status=p.status)


async def _exchange(head: bytes, pieces: list[bytes], gap_s: float, close_early: bool = False,
                    handler: Any = _handler) -> tuple[bytes, list[Any]]:
    app = web.Application()
    app.router.add_post("/x", handler)
    runner = web.AppRunner(app, lingering_time=0.2)  # (the test does not wait out 10 s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    errors: list[Any] = []
    asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: errors.append(ctx))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        answered = asyncio.create_task(reader.read(65536))  # (read as it comes)
        for piece in pieces:
            try:
                writer.write(piece)
                await writer.drain()
            except ConnectionError:  # the console answered and closed: stop trickling
                break
            await asyncio.sleep(gap_s)
        if close_early:
            writer.close()
            await asyncio.sleep(0.3)
            answered.cancel()
            return b"", errors
        answer = await asyncio.wait_for(answered, 5)
        writer.close()
        return answer, errors
    finally:
        await runner.cleanup()


def _head(length: int) -> bytes:
    return (b"POST /x HTTP/1.1\r\nHost: console\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % length)


def test_a_body_trickled_past_the_limit_is_refused_with_408(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forms, "BODY_READ_S", 0.5)
    body = json.dumps({"note": "x" * 40}).encode()
    answer, _ = asyncio.run(_exchange(_head(len(body)), [body[i:i + 1] for i in range(20)],
                                      0.05))
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert b"did not arrive within" in answer


def test_a_body_sent_in_time_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forms, "BODY_READ_S", 2.0)
    body = json.dumps({"note": "hello"}).encode()
    answer, _ = asyncio.run(_exchange(_head(len(body)), [body[:5], body[5:]], 0.05))
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(body)


def test_a_client_gone_mid_body_is_a_400_not_a_traceback() -> None:
    answered: list[int] = []

    async def spy(request: web.Request) -> web.Response:
        resp = await _handler(request)
        answered.append(resp.status)
        return resp

    async def main() -> list[Any]:
        _answer, errors = await _exchange(_head(100), [b'{"a":'], 0.1, close_early=True,
                                          handler=spy)
        return errors

    errors = asyncio.run(main())
    assert answered == [400]
    assert not errors
