"""HTTP client benchmark for the delivery hot path (bounded; traffic to 127.0.0.1 only).

Against bench/fast_receiver.py in a separate process, POSTs a 600-byte JSON body
``--requests`` times with ``--concurrency`` requests in flight (keep-alive), after a short
warm-up, through:

  a. aiohttp ClientSession (TCPConnector limit = concurrency);
  b. postbacks.transport.h1.H1Pool (the own client);
  c. postbacks.transport.http.HttpTransport.send (allow_loopback=True): the full path the
     agent uses (URL vetting, resolver cache, redirects off, SendResult).

Reports requests/s (wall clock) and CPU µs per request of this process (time.process_time,
so the receiver's CPU is excluded). Each client stops early after ``--max-seconds``.

Usage: python bench/http_clients.py [--requests 20000] [--concurrency 64] [--loop uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import uvloop

from postbacks.core.render import RenderedRequest
from postbacks.tools.procs import free_port, http_json, wait_for
from postbacks.transport.h1 import H1Pool, PoolKey
from postbacks.transport.http import HttpTransport

HERE = Path(__file__).resolve().parent
WARMUP = 1000


def _body() -> bytes:
    doc = {"id": "dlv_0123456789abcdef", "event": "conversion", "campaign": "cmp_42",
           "click_id": "c" * 64, "payout": "1.2500", "currency": "USD", "pad": ""}
    raw = orjson.dumps(doc)
    doc["pad"] = "x" * (600 - len(raw))
    body = orjson.dumps(doc)
    assert len(body) == 600, len(body)
    return body


BODY = _body()
HEADERS = {"content-type": "application/json", "webhook-id": "msg_0123456789",
           "webhook-timestamp": "1700000000", "webhook-signature": "v1,abcdefghijklmnop=",
           "idempotency-key": "dlv_0123456789abcdef"}


@dataclass
class Row:
    name: str
    done: int
    errors: int
    wall_s: float
    cpu_s: float

    @property
    def rate(self) -> float:
        return self.done / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.done * 1e6 if self.done else float("nan")


async def _drive(name: str, one: Callable[[int], Awaitable[bool]], total: int,
                 concurrency: int, max_s: float) -> Row:
    """Warm up, then ``total`` calls of ``one`` from ``concurrency`` workers."""
    async def worker(n: int, deadline: float, counts: list[int]) -> None:
        while counts[0] < n and time.monotonic() < deadline:
            counts[0] += 1
            ok = await one(counts[0])
            if not ok:
                counts[1] += 1

    warm = [0, 0]
    await asyncio.gather(*(worker(WARMUP, time.monotonic() + max_s, warm)
                           for _ in range(concurrency)))
    counts = [0, 0]
    deadline = time.monotonic() + max_s
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(total, deadline, counts) for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return Row(name, counts[0], counts[1], wall, cpu)


async def bench_aiohttp(base: str, total: int, conc: int, max_s: float) -> Row:
    connector = aiohttp.TCPConnector(limit=conc, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        async def one(i: int) -> bool:
            async with session.post(f"{base}/hooks/ep_{i % 100}", data=BODY,
                                    headers=HEADERS) as resp:
                await resp.read()
                return resp.status == 200

        return await _drive("aiohttp ClientSession", one, total, conc, max_s)


async def bench_h1(port: int, total: int, conc: int, max_s: float) -> Row:
    key = PoolKey("http", "127.0.0.1", port, None)
    host = f"127.0.0.1:{port}"
    async with H1Pool(max_per_key=conc, max_total=conc) as pool:
        async def one(i: int) -> bool:
            resp = await pool.request(key, "POST", f"/hooks/ep_{i % 100}", host, HEADERS, BODY,
                                      timeout_s=10.0)
            return resp.status == 200

        return await _drive("h1 H1Pool.request", one, total, conc, max_s)


async def bench_transport(base: str, total: int, conc: int, max_s: float) -> Row:
    reqs = [RenderedRequest("POST", f"{base}/hooks/ep_{i}", dict(HEADERS), BODY)
            for i in range(100)]
    async with HttpTransport(timeout_s=10.0, allow_loopback=True, limit=conc) as transport:
        async def one(i: int) -> bool:
            result = await transport.send(reqs[i % 100])
            return result.http.status == 200

        return await _drive("HttpTransport.send (h1)", one, total, conc, max_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-seconds", type=float, default=60.0, help="cap per client")
    ap.add_argument("--loop", choices=("uvloop", "asyncio", "both"), default="both")
    ap.add_argument("--only", choices=("aiohttp", "h1", "transport"), action="append")
    args = ap.parse_args()
    total, conc, max_s = min(args.requests, 1_000_000), args.concurrency, args.max_seconds
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    receiver = subprocess.Popen([sys.executable, str(HERE / "fast_receiver.py"), str(port)])
    try:
        wait_for(lambda: http_json(f"{base}/_stats") is not None, 20, what="receiver")
        loops = ("uvloop", "asyncio") if args.loop == "both" else (args.loop,)
        wanted = args.only or ["aiohttp", "h1", "transport"]
        rows: list[tuple[str, Row]] = []
        for loop_name in loops:
            runner = uvloop.run if loop_name == "uvloop" else asyncio.run
            for which in wanted:
                if which == "aiohttp":
                    row = runner(bench_aiohttp(base, total, conc, max_s))
                elif which == "h1":
                    row = runner(bench_h1(port, total, conc, max_s))
                else:
                    row = runner(bench_transport(base, total, conc, max_s))
                rows.append((loop_name, row))
                print(f"  {loop_name:8} {row.name:26} {row.rate:9,.0f} req/s "
                      f"{row.cpu_us:7.1f} µs CPU/req", file=sys.stderr, flush=True)
        served = http_json(f"{base}/_stats")["count"]
    finally:
        receiver.terminate()
        receiver.wait(10)
    print(f"\n{total:,} POSTs of {len(BODY)} B, {conc} concurrent, keep-alive, "
          f"receiver in a separate process (served {served:,} incl. warm-up)\n")
    print("| loop | client | requests | errors | req/s | CPU µs/request |")
    print("|---|---|---:|---:|---:|---:|")
    for loop_name, r in rows:
        print(f"| {loop_name} | {r.name} | {r.done:,} | {r.errors} | {r.rate:,.0f} "
              f"| {r.cpu_us:.1f} |")


if __name__ == "__main__":
    main()
