"""Delivery-engine benchmark (bounded in count and time; traffic to 127.0.0.1 only).

Measures, in one run so ratios are fair on a shared machine:
  1. the bare aiohttp client's POST rate against a fast local receiver;
  2. one agent process's deliveries/s against the same receiver, and its CPU µs/delivery;
  3. the delivery engine end to end: a backlog of deliveries -> agent -> sink -> PostgreSQL
     (bench/engine.py); the same with the deliveries offered at a steady rate, and whether
     it kept up (part ``sustain``); and the whole pipeline: conversions -> fanout -> gate ->
     agent -> sink;
  4. relay lateness p50/p99 (republish time - due_at);
  5. healthy-endpoint p99 latency with and without a 15-s endpoint on the same partition.

Usage: make bench   (or: python bench/delivery.py --deliveries 20000)
Needs the services (`make services-up`) and KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import uvloop
from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine import run_engine
from bench.figures import host_relative, merge_results, summarize_rounds
from bench.harness import (
    ROOT,
    DispatchWriter,
    arrived,
    cleanup,
    cpu_s,
    endpoints_for,
    env_for,
    fast_receiver,
    fresh,
    metrics_of,
    own_cpu_s,
    pct,
    produce_dispatch,
    say,
    scratch_database,
    service_pids,
    tree_cpu,
    tree_cpu_since,
)
from postbacks.codec import codec_for
from postbacks.core.endpoint import Endpoint
from postbacks.core.fanout import plan_deliveries
from postbacks.db.migrate import migrate
from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from postbacks.topics import TOPICS

# Conversions of each run are new ones (their ids come from the seed): with the ids of an
# earlier run, every delivery row the sink writes would meet its old copy and be skipped
# (ON CONFLICT DO NOTHING), and PostgreSQL's share would be measured without the inserts.
RUN_SEED = int(time.time())
BODY = b'{"schema_version":1,"type":"conversion","data":{' + b'"x":"' + b"a" * 540 + b'"}}'


async def _bare(url: str, n: int, concurrency: int = 64) -> float:
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post(url, data=BODY,
                                        headers={"content-type": "application/json"}) as r:
                    await r.read()

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - start)


def run_agent_alone(base: Settings, n: int, n_endpoints: int, log_dir: Path) -> dict[str, float]:
    s = fresh(base, "agent")
    with Stack(env_for(s), log_dir) as stack, fast_receiver() as (url, _rx):
        say("bare aiohttp client: 20,000 POSTs, 64 concurrent ...")
        own0 = own_cpu_s()
        bare = uvloop.run(_bare(f"{url}/hooks/bare", 20_000))
        bare_cpu = (own_cpu_s() - own0) / 20_000 * 1e6
        say(f"host: the bare client {bare:.0f} POSTs/s, {bare_cpu:.0f} µs CPU each (the "
            f"reference machine in docs/performance.md: ~12,000/s with uvloop)")
        http_json(f"{url}/_reset", {})
        seeded = seed_endpoints(s, apps=n_endpoints, endpoints_per_app=1, receiver_url=url,
                                namespace=s.instance_id.replace("-", ""),
                                now_ms=int(time.time() * 1000))
        eps = endpoints_for(s, seeded)
        say(f"producing {n} dispatch records over {n_endpoints} endpoints ...")
        produce_dispatch(s, eps, n // n_endpoints)
        agent = stack.start("agent", "agent")
        wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 60, interval=0.01,
                 what="first delivery")
        t0, c0 = time.perf_counter(), cpu_s(agent.pid)
        count0 = http_json(f"{url}/_stats")["count"]
        wait_for(lambda: http_json(f"{url}/_stats")["count"] >= n, 300, interval=0.05,
                 what=f"{n} deliveries")
        elapsed, cpu = time.perf_counter() - t0, cpu_s(agent.pid) - c0
        done = n - count0
        rate = done / elapsed
        say(f"agent: {rate:.0f} deliveries/s, {cpu / done * 1e6:.0f} µs CPU each; "
            f"bare client {bare:.0f}/s")
        return {"bare_client_per_s": bare, "bare_client_cpu_us_per_request": bare_cpu,
                "agent_per_s": rate,
                "agent_cpu_us_per_delivery": cpu / done * 1e6, "bare_over_agent": bare / rate}


def run_end_to_end(base: Settings, n: int, log_dir: Path,
                   seed: int = RUN_SEED) -> dict[str, float]:
    s = fresh(base, "e2e")
    with fast_receiver() as (url, rx):
        ns = s.instance_id.replace("-", "")
        seed_endpoints(s, apps=50, endpoints_per_app=1, receiver_url=url, namespace=ns,
                       now_ms=int(time.time() * 1000))
        with Stack(env_for(s), log_dir) as stack:
            for stage in ("sink", "agent", "gate", "fanout"):
                stack.start(stage, stage)
            # CPU from the first to the last delivery, and from before the first
            # conversion: fan-out runs ahead and is mostly done before the first delivery
            # (the sink's last rows, written after it, are not counted)
            pids = {name: p.pid for name, p in stack.procs.items()} | {"receiver": rx.pid}
            pids |= service_pids()
            cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
            producer = ConversionProducer(s)
            for ev in synthetic_conversions(n, apps=50, seed=seed, namespace=ns,
                                            now_ms=int(time.time() * 1000)):
                producer.send(ev)
            producer.flush()
            wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 60, interval=0.01,
                     what="first delivery")
            t0 = time.perf_counter()
            c0 = http_json(f"{url}/_stats")["count"]
            cpu1 = {name: tree_cpu(pid) for name, pid in pids.items()}
            try:
                wait_for(lambda: http_json(f"{url}/_stats")["count"] >= n, 300, interval=0.05,
                         what=f"{n} deliveries end to end")
            except TimeoutError:
                for proc in stack.procs.values():
                    print(f"--- {proc.name}\n{proc.tail(20)}")
                print(metrics_of(stack.procs["agent"].log_path))
                raise
            rate = (n - c0) / (time.perf_counter() - t0)
            share = {name: tree_cpu_since(pid, cpu1[name]) / (n - c0) * 1e6
                     for name, pid in pids.items()}
            whole = {name: tree_cpu_since(pid, cpu0[name]) / n * 1e6
                     for name, pid in pids.items()}

            def fmt(d: dict[str, float]) -> str:
                return ", ".join(f"{k} {v:.0f}" for k, v in sorted(d.items(), key=lambda x: -x[1])
                                 ) + f"; total {sum(d.values()):.0f}"

            say(f"end to end: {rate:.0f} deliveries/s; CPU µs per delivery by process, from the "
                f"first to the last delivery: {fmt(share)}")
            say(f"... and from the first conversion produced (fan-out runs ahead; start-up and "
                f"idle polling included): {fmt(whole)}")
            return {"end_to_end_per_s": rate,
                    "end_to_end_cpu_us_per_delivery": sum(share.values()),
                    "end_to_end_cpu_us_per_delivery_whole_run": sum(whole.values())}


def run_pipeline_latency(base: Settings, rate: float, seconds: float,
                         log_dir: Path) -> dict[str, float]:
    """Conversion -> postback latency through the whole pipeline at a steady ``rate``: for
    each delivery, its arrival at the receiver minus the moment its conversion was handed
    to the producer (one host clock)."""
    s = fresh(base, "lat")
    with fast_receiver() as (url, _rx):
        ns = s.instance_id.replace("-", "")
        seeded = seed_endpoints(s, apps=20, endpoints_per_app=1, receiver_url=url,
                                namespace=ns, now_ms=int(time.time() * 1000))
        by_app = {e.app_id: e for e in endpoints_for(s, seeded)}
        idem = s.idempotency_key.reveal().encode()
        n = int(rate * seconds)
        events = list(synthetic_conversions(n + 1, apps=20, seed=RUN_SEED + 1, namespace=ns,
                                            now_ms=int(time.time() * 1000)))
        with Stack(env_for(s), log_dir) as stack:
            for stage in ("sink", "agent", "gate", "fanout"):
                stack.start(stage, stage)
            producer = ConversionProducer(s)
            producer.send(events[0])  # through every stage once before the timed traffic
            producer.flush()
            wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 90, interval=0.05,
                     what="the warm-up delivery")
            time.sleep(5.0)  # consumer groups settled (a late rebalance stalls ~1 s)
            sent: dict[str, float] = {}
            start = time.perf_counter()
            for i, ev in enumerate(events[1:]):
                while time.perf_counter() < start + i / rate:
                    time.sleep(0.0005)
                keys = [d["idempotency_key"] for d in plan_deliveries(
                    ev, [by_app[ev["app_id"]]], idem_key=idem, now_ms=int(time.time() * 1000))]
                t = time.time()
                producer.send(ev)
                for k in keys:
                    sent[k] = t
            producer.flush()
            wait_for(lambda: arrived(url, sent), 120,
                     what=f"{len(sent)} deliveries")
            times = http_json(f"{url}/_times")
        lat = [(times[k] - t) * 1000 for k, t in sent.items()]
        t0 = min(sent.values())
        slow = sorted(((times[k] - t) * 1000, t - t0) for k, t in sent.items())[-len(lat) // 100:]
        say(f"pipeline latency at {rate:.0f} conversions/s over {len(lat)} deliveries: "
            f"p50 {pct(lat, 50):.0f} ms, p99 {pct(lat, 99):.0f} ms, max {max(lat):.0f} ms; "
            "the slowest 1% sent at s " + ", ".join(sorted({f"{x:.1f}" for _, x in slow})))
        return {"pipeline_latency_rate": rate, "pipeline_latency_p50_ms": pct(lat, 50),
                "pipeline_latency_p99_ms": pct(lat, 99), "pipeline_latency_max_ms": max(lat)}


def run_relay_lateness(base: Settings, n: int, log_dir: Path) -> dict[str, float]:
    s = fresh(base, "relay")
    codec = codec_for("Delivery")
    p = Producer({"bootstrap.servers": s.kafka_bootstrap_servers, "linger.ms": 5,
                  "enable.idempotence": True})  # in order, even across a retried batch
    ep = Endpoint("ep_bench_relay", "app_bench", "http://127.0.0.1:9/", frozenset({"*"}))
    events = list(synthetic_conversions(n, apps=1, seed=3, namespace="relay",
                                        now_ms=int(time.time() * 1000)))
    start = int(time.time() * 1000) + 3000
    for i, ev in enumerate(events):
        ev["app_id"] = ep.app_id
        for d in plan_deliveries(ev, [ep], idem_key=b"k", now_ms=start):
            d["due_at"] = start + i * 2  # a steady stream falling due over n*2 ms
            p.produce(s.topic(TOPICS.retry_tier("5s").base), codec.encode(d), b"ep_bench_relay")
    p.flush(30)
    from confluent_kafka import Consumer

    with Stack(env_for(s), log_dir) as stack:
        stack.start("relay", "relay")
        c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers, "group.id": "bench-lat",
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        c.subscribe([s.topic(TOPICS.dispatch.base)])
        late: list[float] = []
        early = 0
        deadline = time.monotonic() + 120
        while len(late) < n and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    d = codec.decode(m.value())
                    delta = d["enqueued_at"] - d["due_at"]
                    early += delta < 0
                    late.append(delta)
        c.close()
    say(f"relay lateness over {len(late)}: p50 {pct(late, 50):.0f} ms, p99 {pct(late, 99):.0f} ms,"
        f" early {early}")
    return {"relay_lateness_p50_ms": pct(late, 50), "relay_lateness_p99_ms": pct(late, 99),
            "relay_early": float(early)}


ISO_WAVE_S = 0.05  # one delivery per healthy endpoint every 50 ms: 400/s
ISO_WAVES = 200  # 10 s, 4,000 healthy deliveries per run
ISO_SLOW_EVERY = 10  # with the slow endpoint: one delivery to it every 0.5 s (20 per run)


def run_isolation(base: Settings, with_slow: bool, log_dir: Path) -> float:
    """Healthy-endpoint latency (record handed to the producer -> arrival at the receiver)
    at a steady 400 deliveries/s over 20 healthy endpoints, all on partition 0, with or
    without a 21st endpoint on the same partition that answers after 15 s. Returns p99."""
    s = fresh(base, "iso1" if with_slow else "iso0")
    ns = s.instance_id.replace("-", "")
    slow_id = f"ep_{ns}_0001_1"
    with fast_receiver(slow_id, "15") as (url, _rx):
        seeded = seed_endpoints(s, apps=21, endpoints_per_app=1, receiver_url=url,
                                namespace=ns, now_ms=int(time.time() * 1000))
        eps = endpoints_for(s, seeded)
        slow, healthy = eps[0], eps[1:]
        writer = DispatchWriter(s, linger_ms=2)
        with Stack(env_for(s, POSTBACKS_HTTP_TIMEOUT_S="30"), log_dir) as stack:
            stack.start("agent", "agent")
            # warm up: the agent has joined its group and delivered once before measuring
            first = writer.send(healthy[:1], 1, seed=10_000_000, partition=0)
            wait_for(lambda: arrived(url, first), 60,
                     interval=0.05, what="warm-up delivery")
            keys: dict[str, int] = {}
            t0 = time.monotonic()
            for i in range(ISO_WAVES):  # on an absolute schedule: no drift
                if with_slow and i % ISO_SLOW_EVERY == 0:
                    writer.send([slow], 1, seed=20_000_000 + i, partition=0, flush=False)
                keys.update(writer.send(healthy, 1, seed=i + 1, partition=0, flush=False))
                time.sleep(max(0.0, t0 + (i + 1) * ISO_WAVE_S - time.monotonic()))
            writer.close()
            wait_for(lambda: arrived(url, keys), 120,
                     what="healthy deliveries")
            times = http_json(f"{url}/_times")
            lat = [(times[k] * 1000 - t) for k, t in keys.items()]
            # the slow endpoint's requests, each held 15 s (its concurrency cap at a time)
            stats = http_json(f"{url}/_stats")
            slow_seen = stats["slow"]
            extra = stats["count"] - slow_seen - len(keys) - len(first)
        if with_slow and slow_seen < 1:
            raise RuntimeError("the slow endpoint received no request: nothing was measured")
        p99 = pct(lat, 99)
        say(f"healthy p99 {'with' if with_slow else 'without'} a 15-s endpoint: {p99:.0f} ms "
            f"(p50 {statistics.median(lat):.0f} ms, max {max(lat):.0f} ms, "
            f"{len(lat)} deliveries; requests to the slow endpoint {slow_seen}, healthy "
            f"re-sends {extra})")
        return p99


def _run_parts(args: argparse.Namespace, parts: set[str], base: Settings, log_dir: Path,
               results: dict[str, float]) -> None:
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):  # the throughput parts, round after round
        if args.rounds > 1:
            say(f"round {r + 1}/{args.rounds}")
        got: dict[str, float] = {}
        if "agent" in parts:
            got |= run_agent_alone(base, args.deliveries, args.endpoints,
                                   log_dir / f"agent-{r}")
        if "engine" in parts:
            got |= run_engine(base, args.deliveries, args.endpoints, RUN_SEED + 7919 * r,
                              log_dir / f"engine-{r}", catch_up=args.engine_catch_up)
        if "sustain" in parts:
            got |= run_engine(base, round(args.sustain_rate * args.sustain_s), args.endpoints,
                              RUN_SEED + 7919 * r + 1, log_dir / f"sustain-{r}",
                              offered=args.sustain_rate)
        if "e2e" in parts:
            got |= run_end_to_end(base, args.deliveries, log_dir / f"e2e-{r}",
                                  seed=RUN_SEED + 7919 * r)
        relative = host_relative(got)
        if relative:
            say("as fractions of the bare client's rate: "
                + ", ".join(f"{k} {v:.2f}" for k, v in relative.items()))
        rounds.append(got | relative)
        cleanup()  # each round's topics: a broker keeping them spends CPU on them
    results |= summarize_rounds(rounds)
    if "latency" in parts:
        results |= run_pipeline_latency(base, args.latency_rate, 10.0, log_dir / "latency")
    if "relay" in parts:
        results |= run_relay_lateness(base, 2000, log_dir / "relay")
    if "isolation" in parts:
        # Alternating pairs: a p99 of ~1,000 ms-scale samples on a shared 2-core machine
        # moves by tens of ms from run to run; the median pair says more than one pair.
        ratios, withouts, withs = [], [], []
        for i in range(args.isolation_pairs):
            without = run_isolation(base, False, log_dir / f"iso0-{i}")
            with_slow = run_isolation(base, True, log_dir / f"iso1-{i}")
            withouts.append(without)
            withs.append(with_slow)
            ratios.append(with_slow / without)
            say(f"isolation pair {i + 1}/{args.isolation_pairs}: {without:.0f} / "
                f"{with_slow:.0f} ms = {with_slow / without:.2f}")
        results |= {"healthy_p99_ms_without_slow": statistics.median(withouts),
                    "healthy_p99_ms_with_slow": statistics.median(withs),
                    "isolation_ratio": statistics.median(ratios),
                    "isolation_ratio_min": min(ratios), "isolation_ratio_max": max(ratios),
                    "isolation_pairs": float(len(ratios))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deliveries", type=int, default=20_000)
    ap.add_argument("--engine-catch-up", action="store_true",
                    help="engine part: start the sink after the backlog is produced (a sink "
                         "catching up) instead of before (steady state)")
    ap.add_argument("--sustain-rate", type=float, default=4000, metavar="PER_S",
                    help="sustain part: the engine as in part engine, the deliveries offered "
                         "at this steady rate instead of as one backlog; it says whether the "
                         "engine kept up (default 4000)")
    ap.add_argument("--sustain-s", type=float, default=15, metavar="SECONDS",
                    help="sustain part: for this long (default 15)")
    ap.add_argument("--endpoints", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the throughput parts (agent, engine, sustain, e2e) this many "
                         "times, one after the other, and report each figure's median, lowest and "
                         "highest (the host's speed swings by a third within an hour)")
    ap.add_argument("--parts", default="agent,engine,sustain,e2e,latency,relay,isolation",
                    help="comma-separated subset of: agent, engine, sustain, e2e, latency, "
                         "relay, isolation")
    ap.add_argument("--latency-rate", type=float, default=200,
                    help="conversions/s for the pipeline latency part (10 s)")
    ap.add_argument("--fresh-db", action="store_true",
                    help="run against a new database beside POSTBACKS_DATABASE_URL's, "
                         "migrated, dropped afterwards (PostgreSQL's share of the engine "
                         "depends on how much the database holds, and every run adds 3 rows "
                         "per delivery)")
    ap.add_argument("--isolation-pairs", type=int, default=5,
                    help="alternating without/with runs of the isolation part (median)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.sustain_rate <= 0 or args.sustain_s < 10:
        ap.error("--sustain-rate must be positive and --sustain-s at least 10")
    base = load_settings()
    log_dir = ROOT / ".local" / "bench-logs" / str(int(time.time()))
    results: dict[str, float] = {}
    with contextlib.ExitStack() as db:
        if args.fresh_db:
            url = db.enter_context(scratch_database(base.database_url,
                                                    f"bench{int(time.time())}"))
            base = dataclasses.replace(base, database_url=url)
            say(f"a fresh database for this run: {url.rsplit('/', 1)[-1]}")
        else:
            migrate(base.database_url)
        try:
            _run_parts(args, parts, base, log_dir, results)
        finally:
            cleanup()
    out = ROOT / "bench" / "results" / "latest.json"
    out.parent.mkdir(exist_ok=True)
    # a run of some parts updates only their figures (the others stay from earlier runs)
    earlier = json.loads(out.read_text()) if out.exists() else {}
    out.write_text(json.dumps(merge_results(earlier, results), indent=2))
    print("\n=== delivery benchmark ===")
    for k, v in results.items():
        print(f"{k:32s} {v:10.2f}")
    print(f"(written to {out})")


if __name__ == "__main__":
    main()
