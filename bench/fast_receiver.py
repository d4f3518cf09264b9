"""A minimal fast receiver for benchmarks: answers 200 at once (or after a per-endpoint
delay), counts requests and records arrival times; no signature verification (the agent's
cost is what is measured, and the receiver shares the machine's two cores with it).

An asyncio protocol over httptools' C parser on uvloop, HTTP/1.1 keep-alive: about a
quarter of the CPU per request of the aiohttp server it replaced, so the end-to-end
benchmark's CPU goes to the pipeline rather than to the stand-in publisher.

Run: python bench/fast_receiver.py PORT [SLOW_ENDPOINT DELAY_S]. Routes:
POST /hooks/{endpoint_id} -> 200 "ok";
GET /_stats -> {"count": n, "slow": requests to the slow endpoint};
GET /_times -> {webhook-id: arrival epoch s}; POST /_reset.
"""

from __future__ import annotations

import asyncio
import sys
import time

import httptools
import orjson
import uvloop

count = 0
slow_count = 0  # requests to the slow endpoint (held ``DELAY_S`` before the answer)
arrivals: dict[str, float] = {}
SLOW: tuple[bytes, float] | None = None


def response(status: bytes, body: bytes, ctype: bytes = b"text/plain") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + ctype + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


OK = response(b"200 OK", b"ok")


class Receiver(asyncio.Protocol):
    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.webhook_id = b""
        self.header_name = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(response(b"400 Bad Request", b"bad request"))
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.webhook_id = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"webhook-id":
            self.webhook_id = value

    def on_message_complete(self) -> None:
        global count, slow_count
        assert self.transport is not None
        url, method = self.url, self.parser.get_method()
        if url.startswith(b"/hooks/") and method == b"POST":
            count += 1
            ep = url[len(b"/hooks/"):].split(b"?", 1)[0]
            keep = self.parser.should_keep_alive()
            if SLOW is not None and ep == SLOW[0]:
                slow_count += 1
                asyncio.get_running_loop().call_later(SLOW[1], self._answer, self.webhook_id,
                                                      keep)
            else:
                self._answer(self.webhook_id, keep)
            return
        elif url == b"/_stats":
            self.transport.write(response(b"200 OK", orjson.dumps({"count": count,
                                                                      "slow": slow_count}),
                                          b"application/json"))
        elif url == b"/_times":
            self.transport.write(response(b"200 OK", orjson.dumps(arrivals),
                                          b"application/json"))
        elif url == b"/_reset" and method == b"POST":
            count = slow_count = 0
            arrivals.clear()
            self.transport.write(response(b"200 OK", b'{"ok": true}', b"application/json"))
        else:
            self.transport.write(response(b"404 Not Found", b"not found"))
        if not self.parser.should_keep_alive():
            self.transport.close()

    def _answer(self, webhook_id: bytes, keep_alive: bool) -> None:
        arrivals[webhook_id.decode()] = time.time()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(OK)
            if not keep_alive:
                self.transport.close()


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Receiver, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    global SLOW
    if len(sys.argv) > 3:
        SLOW = (sys.argv[2].encode(), float(sys.argv[3]))
    uvloop.run(serve(int(sys.argv[1])))


if __name__ == "__main__":
    main()
