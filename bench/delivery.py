"""Delivery-engine benchmark (bounded in count and time; traffic to 127.0.0.1 only).

Measures, in one run so ratios are fair on a shared machine:
  1. the bare aiohttp client's POST rate against a fast local receiver;
  2. one agent process's deliveries/s against the same receiver, and its CPU µs/delivery;
  3. the delivery engine end to end: a backlog of deliveries -> agent -> sink -> PostgreSQL
     (bench/engine.py); the same with the deliveries offered at a steady rate, and whether
     it kept up (part ``sustain``); and the whole pipeline: conversions -> fanout -> gate ->
     agent -> sink;
  4. relay lateness p50/p99 (republish time - due_at);
  5. healthy-endpoint p99 latency with and without a 15-s endpoint on the same partition;
  6. two agent processes against one on the same partitions (bench/agents.py);
  7. the anomaly gate's throughput on a backlog as a ratio to the engine's capacity (3) in
     the same round, and the latency it adds at half that capacity (bench/gate_part.py);
and ends with a table of the figures against the targets, met or not (bench/targets.py).
The pipeline latency is measured at a quarter of the whole pipeline's rate in the run.
(The latency parts -- pipeline latency, 4 and 5 -- live in bench/latency.py.)

Usage: make bench   (or: python bench/delivery.py --deliveries 20000)
Needs the services (`make services-up`) and KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.agents import run_agents
from bench.engine import assigned, run_engine
from bench.figures import host_relative, merge_results, summarize_rounds
from bench.gate_part import run_gate_part
from bench.harness import (
    ROOT,
    cleanup,
    cpu_s,
    endpoints_for,
    env_for,
    fast_receiver,
    fresh,
    metrics_of,
    own_cpu_s,
    produce_dispatch,
    say,
    scratch_database,
    service_pids,
    tree_cpu,
    tree_cpu_since,
)
from bench.latency import run_isolation_pairs, run_pipeline_latency, run_relay_lateness
from bench.targets import table
from postbacks.db.migrate import migrate
from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from topics import GATE_APP

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
        say(f"host: the bare client {bare:.0f} POSTs/s, {bare_cpu:.0f} µs CPU each (every "
            f"figure below is read as a ratio to it)")
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
                "agent_per_s": rate, "agent_over_bare": rate / bare,
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
            for group in ("postbacks-sink", "postbacks-agent", GATE_APP, "postbacks-fanout"):
                # started up and given partitions: start-up is not counted below
                gid = s.topic(group)
                wait_for(lambda g=gid: assigned(s, g), 90, interval=0.2,
                         what=f"{group}'s partitions")
            # CPU from the first to the last delivery, and from before the first
            # conversion: fan-out runs ahead and is mostly done before the first delivery
            # (the sink's last rows, written after it, are not counted). The stages' figures
            # (cpu_us_<stage>) are the second: each stage's work on every delivery.
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
            say(f"... and from the first conversion produced, every stage started and given "
                f"its partitions (fan-out runs ahead): {fmt(whole)}")
            return {"end_to_end_per_s": rate,
                    **{f"cpu_us_{name}": v for name, v in whole.items()},
                    "end_to_end_cpu_us_per_delivery": sum(share.values()),
                    "end_to_end_cpu_us_per_delivery_whole_run": sum(whole.values())}


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
        if "gate" in parts:  # against the engine just measured, in the same round
            cleanup()  # the engine's topics: the broker spends CPU on every partition
            got |= run_gate_part(base, got["engine_end_to_end_per_s"], args.gate_deliveries,
                                 log_dir / f"gate-{r}")
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
    if "agents" in parts:
        results |= run_agents(base, args.deliveries, args.endpoints, RUN_SEED + 3,
                              log_dir / "agents")
        cleanup()
    if "latency" in parts:
        # at a quarter of the pipeline's capacity measured in this run (one delivery per
        # conversion), unless a rate is given or the pipeline was not measured
        rate = args.latency_rate or (results["end_to_end_per_s"] / 4
                                     if "end_to_end_per_s" in results else 200.0)
        results |= run_pipeline_latency(base, rate, 10.0, log_dir / "latency", RUN_SEED + 1)
    if "relay" in parts:
        results |= run_relay_lateness(base, 2000, log_dir / "relay")
    if "isolation" in parts:
        results |= run_isolation_pairs(base, args.isolation_pairs, log_dir, args.isolation_s)


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
    ap.add_argument("--parts", default="agent,engine,gate,e2e,agents,latency,relay,isolation",
                    help="comma-separated subset of: agent, engine, gate, sustain, e2e, agents, "
                         "latency, relay, isolation (default: all but sustain); gate needs "
                         "engine and adds it")
    ap.add_argument("--gate-deliveries", type=int, default=100_000,
                    help="gate part: the backlog the gate's throughput is measured on")
    ap.add_argument("--latency-rate", type=float, default=None,
                    help="conversions/s for the pipeline latency part (10 s); default a "
                         "quarter of the whole pipeline's rate measured by part e2e in the "
                         "same run (200 without it)")
    ap.add_argument("--fresh-db", action="store_true",
                    help="run against a new database beside POSTBACKS_DATABASE_URL's, "
                         "migrated, dropped afterwards (PostgreSQL's share of the engine "
                         "depends on how much the database holds, and every run adds 3 rows "
                         "per delivery)")
    ap.add_argument("--isolation-s", type=float, default=20.0,
                    help="seconds of timed healthy traffic in each isolation run (400/s)")
    ap.add_argument("--isolation-pairs", type=int, default=6,
                    help="alternating without/with runs of the isolation part (median)")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if "gate" in parts:  # its figures are ratios to the engine's capacity in the same round
        parts.add("engine")
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
    print("\n=== delivery benchmark: every figure ===")
    for k, v in results.items():
        print(f"{k:40s} {v:12.2f}")
    print(f"(written to {out})")
    print("\n=== delivery benchmark: the targets (docs/performance.md) ===")
    print(table(results))


if __name__ == "__main__":
    main()
