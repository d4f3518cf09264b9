"""A minimal fast receiver for benchmarks: answers 200 at once (or after a per-endpoint
delay), counts requests and records arrival times; no signature verification (the agent's
cost is what is measured). Run: python bench/fast_receiver.py PORT [SLOW_ENDPOINT DELAY_S]."""

from __future__ import annotations

import asyncio
import sys
import time

import orjson
import uvloop
from aiohttp import web

count = 0
arrivals: dict[str, float] = {}


async def hook(request: web.Request) -> web.Response:
    global count
    await request.read()
    count += 1
    ep = request.match_info["endpoint_id"]
    if len(sys.argv) > 3 and ep == sys.argv[2]:
        await asyncio.sleep(float(sys.argv[3]))
    arrivals[request.headers.get("webhook-id", "")] = time.time()
    return web.Response(text="ok")


async def stats(_r: web.Request) -> web.Response:
    return web.json_response({"count": count})


async def times(_r: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(arrivals), content_type="application/json")


async def reset(_r: web.Request) -> web.Response:
    global count
    count = 0
    arrivals.clear()
    return web.json_response({"ok": True})


def main() -> None:
    app = web.Application()
    app.router.add_post("/hooks/{endpoint_id}", hook)
    app.router.add_get("/_stats", stats)
    app.router.add_get("/_times", times)
    app.router.add_post("/_reset", reset)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
