"""Anomaly gate benchmark: throughput, added latency, CPU per delivery (issue 4 figures).

1. **Throughput**: N deliveries are put on ``deliveries.v1`` first, then one gate process
   starts; the rate is N / (time from its first to its last output), and its CPU time per
   delivery. Every detector is armed (retrodating and value rate in detect, per endpoint
   and global) so the gate does all of its work while dispatching everything.
2. **Added latency**: with the gate running, deliveries are produced at a fixed rate; for
   each, the gate's output record's timestamp minus the input record's (both CreateTime on
   this host) -- the time the gate adds, p50/p99.

Results go to stdout and ``bench/results/gate-latest.json``. Usage:
``python bench/gate.py [--n 100000] [--rate 2000] [--seconds 10]``. Topics are deleted at
the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery import ROOT, cpu_s, env_for, fresh, pct, say
from postbacks.codec import codec_for
from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.db.migrate import migrate
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack
from postbacks.topics import TOPICS
from postbacks.topics.admin import delete_prefixed_topics
from tests.unit.factories import make_conversion, make_delivery


def arm(s: Settings, endpoints: list[str]) -> None:
    """Every detector in detect: the gate evaluates everything, holds nothing."""
    with connect(s.database_url) as conn:
        for det in ("retrodating", "value_rate"):
            set_mode(conn, scope="global", scope_key=s.anomaly_global_key, detector=det,
                     mode="detect", actor="bench")
        for ep in endpoints[:20]:
            set_mode(conn, scope="endpoint", scope_key=ep, detector="value_rate",
                     mode="detect", actor="bench")
        conn.commit()


def produce(s: Settings, n: int, endpoints: list[str], tag: str, rate: float = 0.0) -> None:
    codec = codec_for("Delivery")
    p = Producer({"bootstrap.servers": s.kafka_bootstrap_servers, "linger.ms": 5,
                  "partitioner": "murmur2_random", "compression.type": "lz4"})
    start = time.monotonic()
    topic = s.topic(TOPICS.deliveries.base)
    for i in range(n):
        now = int(time.time() * 1000)
        ep = endpoints[i % len(endpoints)]
        conv = make_conversion(event_id=f"e{i}", conversion_id=f"c{uuid.uuid4().hex[:12]}",
                               app_id=f"app_{ep}", occurred_at=now - 5000,
                               source_created_at=now - 4000, source_completed_at=now - 9000,
                               payout_usd_micros=1_000_000 + (i % 7) * 250_000)
        d = make_delivery(delivery_id=f"dlv_{tag}{i}", endpoint_id=ep, conversion=conv,
                          created_at=now, enqueued_at=None)
        while True:
            try:
                p.produce(topic, codec.encode(d), ep.encode())
                break
            except BufferError:
                p.poll(0.05)
        if rate > 0:
            ahead = (i + 1) / rate - (time.monotonic() - start)
            if ahead > 0:
                p.poll(0)
                time.sleep(ahead)
    assert p.flush(60) == 0


def read_outputs(s: Settings, n: int, timeout: float) -> list[tuple[int, int]]:
    """(output timestamp ms, local receive ms) of n records from dispatch.v1 + held.v1."""
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                  "group.id": f"bench-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([s.topic(TOPICS.dispatch.base), s.topic(TOPICS.held.base)])
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.5):
                if m.error() is None:
                    out.append((m.timestamp()[1], int(time.time() * 1000)))
    finally:
        c.close()
    return out


def input_times(s: Settings) -> dict[str, int]:
    """delivery_id -> input CreateTime, from deliveries.v1."""
    codec = codec_for("Delivery")
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                  "group.id": f"bench-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([s.topic(TOPICS.deliveries.base)])
    out: dict[str, int] = {}
    idle = 0
    while idle < 6:
        msgs = c.consume(1000, timeout=0.5)
        idle = 0 if msgs else idle + 1
        for m in msgs:
            if m.error() is None:
                out[codec.decode(m.value())["delivery_id"]] = m.timestamp()[1]
    c.close()
    return out


def added_latency(s: Settings, n: int, tag: str) -> tuple[list[float], list[float]]:
    """Added latency of every delivery, and of those after the first second (warm-up)."""
    codec = codec_for("Delivery")
    created = input_times(s)
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                  "group.id": f"bench-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([s.topic(TOPICS.dispatch.base)])
    lat: list[float] = []
    worst: list[tuple[int, int]] = []
    deadline = time.monotonic() + 60
    while len(lat) < n and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.5):
            if m.error() is None:
                did = codec.decode(m.value())["delivery_id"]
                t0 = created.get(did)
                if t0 is not None and did.startswith(f"dlv_{tag}"):
                    lat.append(m.timestamp()[1] - t0)
                    worst.append((m.timestamp()[1] - t0, t0))
    c.close()
    first = min((t for _, t in worst), default=0)
    slow = sorted(worst)[-max(1, len(worst) // 100):]
    say("slowest 1% were produced at s " + ", ".join(sorted({f"{(t - first) / 1000:.1f}"
                                                             for _, t in slow})))
    return lat, [x for x, t in worst if t - first >= 1000]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="deliveries for the throughput run")
    ap.add_argument("--rate", type=float, default=2000, help="deliveries/s for the latency run")
    ap.add_argument("--seconds", type=float, default=10, help="length of the latency run")
    ap.add_argument("--endpoints", type=int, default=300)
    ap.add_argument("--commit-s", help="POSTBACKS_GATE_COMMIT_INTERVAL_S for the gate")
    ap.add_argument("--profile", metavar="FILE", help="py-spy the gate during the throughput run")
    args = ap.parse_args()
    base = load_settings()
    migrate(base.database_url)
    results: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    log_dir = ROOT / ".local" / "bench-logs" / f"gate-{int(time.time())}"

    s = fresh(base, "gate")
    s = dataclasses.replace(s, anomaly_global_key=s.instance_id + "-g")
    endpoints = [f"ep_bench_{s.instance_id}_{i}" for i in range(args.endpoints)]
    arm(s, endpoints)
    try:
        say(f"throughput: producing {args.n:,} deliveries over {args.endpoints} endpoints")
        produce(s, args.n, endpoints, "t")
        extra = {"POSTBACKS_GATE_COMMIT_INTERVAL_S": args.commit_s} if args.commit_s else {}
        env = env_for(s, POSTBACKS_ANOMALY_GLOBAL_KEY=s.anomaly_global_key, **extra)
        with Stack(env, log_dir) as stack:
            t_start = time.time()
            gate = stack.start("gate", "gate")
            if args.profile:
                import subprocess

                spy = str(Path(sys.executable).parent / "py-spy")
                subprocess.Popen([spy, "record", "-r", "200", "-d", "12", "-f", "raw",
                                  "-o", args.profile, "-p", str(gate.pid)])
            got = read_outputs(s, args.n, timeout=600)
            wall = time.time() - t_start
            cpu = cpu_s(gate.pid)
            first = min(t for t, _ in got)
            last = max(t for t, _ in got)
            rate = len(got) / max(1e-9, (last - first) / 1000)
            say(f"gate: {len(got):,} outputs, {rate:,.0f} deliveries/s between first and last "
                f"output (wall from process start {wall:.1f}s), CPU {cpu:.1f}s "
                f"= {cpu / len(got) * 1e6:.0f} µs/delivery incl. start-up")
            results["throughput_per_s"] = round(rate)
            results["cpu_us_per_delivery"] = round(cpu / len(got) * 1e6)
            results["startup_to_first_output_s"] = round(first / 1000 - t_start, 2)

            say(f"latency: {args.rate:.0f}/s for {args.seconds:.0f}s through the running gate")
            m = int(args.rate * args.seconds)
            produce(s, m, endpoints, "l", rate=args.rate)
            lat, steady = added_latency(s, m, "l")
            p50, p99 = pct(lat, 50), pct(lat, 99)
            say(f"gate added latency over {len(lat):,} deliveries: p50 {p50:.0f} ms, "
                f"p99 {p99:.0f} ms, max {max(lat):.0f} ms; after the first second: "
                f"p50 {pct(steady, 50):.0f} ms, p99 {pct(steady, 99):.0f} ms")
            results.update(latency_p50_ms=p50, latency_p99_ms=p99, latency_n=len(lat),
                           latency_rate=args.rate, steady_p50_ms=pct(steady, 50),
                           steady_p99_ms=pct(steady, 99))
    finally:
        delete_prefixed_topics(s, s.topic_prefix)
    out = ROOT / "bench" / "results" / "gate-latest.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    say(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
