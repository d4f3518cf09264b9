"""Anomaly gate benchmark: throughput, added latency, CPU per delivery.

1. **Throughput**: N deliveries are put on ``deliveries.v1`` first, then one gate process
   starts; the rate is N / (time from its first to its last output), and its CPU time per
   delivery. Every detector is armed (retrodating and value rate in detect, per endpoint
   and global) so the gate does all of its work while dispatching everything.
2. **Added latency**: once the gate has committed all of the throughput run (its
   aggregator of the partials included) and sat idle for ``--idle-s``, deliveries are
   produced at a fixed rate; for each, the gate's output record's timestamp minus the input
   record's (both CreateTime on this host) -- the time the gate adds, p50/p99, after the
   first second and in the first second (the first after an idle gate). Without the wait
   (``--back-to-back``) the first second measures the gate still aggregating the burst.
   ``--series FILE`` writes every delivery's latency against its send time (commit-time
   stalls show up as a period of ``POSTBACKS_GATE_COMMIT_INTERVAL_S``).

The two parts are functions (:func:`throughput`, :func:`latency`, both through one gate by
:func:`run`); part ``gate`` of ``bench/delivery.py`` runs them against the delivery engine's
capacity measured in the same run (bench/gate_part.py).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import ROOT, cpu_s, env_for, fresh, pct, say, send_record
from postbacks.codec import codec_for
from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.db.migrate import migrate
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, metrics_page
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS
from topics.admin import delete_prefixed_topics


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


def producer(s: Settings) -> Producer:
    return Producer({"bootstrap.servers": s.kafka_bootstrap_servers, "linger.ms": 5,
                     "partitioner": "murmur2_random", "compression.type": "lz4",
                     "enable.idempotence": True})  # in order, even across a retried batch


def warm_producer(s: Settings, endpoints: list[str]) -> Producer:
    """A producer that has sent (and flushed) one delivery, tagged ``warm``: connected, with
    the topic's metadata and its idempotent producer id. A fresh idempotent producer holds
    its first records until the broker grants the id (hundreds of ms when the transaction
    coordinator is still loading), and those records' CreateTime would count as the gate's
    added latency."""
    p = producer(s)
    produce(s, 1, endpoints, "warm", p=p)
    return p


def produce(s: Settings, n: int, endpoints: list[str], tag: str, rate: float = 0.0,
            p: Producer | None = None) -> None:
    codec = codec_for("Delivery")
    p = p or producer(s)
    topic = s.topic(TOPICS.deliveries.base)
    start = time.monotonic()
    for i in range(n):
        now = int(time.time() * 1000)
        ep = endpoints[i % len(endpoints)]
        conv = make_conversion(event_id=f"e{i}", conversion_id=f"c{uuid.uuid4().hex[:12]}",
                               app_id=f"app_{ep}", occurred_at=now - 5000,
                               source_created_at=now - 4000, source_completed_at=now - 9000,
                               payout_usd_micros=1_000_000 + (i % 7) * 250_000)
        d = make_delivery(delivery_id=f"dlv_{tag}{i}", endpoint_id=ep, conversion=conv,
                          created_at=now, enqueued_at=None)
        send_record(p, topic, codec.encode(d), ep.encode())
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


def wait_drained(s: Settings, timeout: float = 120.0) -> float:
    """Wait until the gate has committed everything on deliveries.v1 and on its own
    anomaly.partials.v1 (the aggregator trails the gate by seconds after a burst); the
    seconds it took."""
    from confluent_kafka import TopicPartition

    start = time.monotonic()
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                  "group.id": f"{s.topic_prefix}postbacks-gate", "enable.auto.commit": False})
    tps = [TopicPartition(s.topic(t.base), p) for t in (TOPICS.deliveries, TOPICS.anomaly_partials)
           for p in range(t.partitions)]
    try:
        while time.monotonic() - start < timeout:
            done = c.committed(tps, timeout=10)
            ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
            if all(tp.offset >= end for tp, end in zip(done, ends, strict=True)):
                break
            time.sleep(0.2)
    finally:
        c.close()
    return time.monotonic() - start


def gc_pauses(log_path: Path) -> dict[str, float]:
    """The gate's garbage-collection pauses so far, from its /metrics: per generation the
    count, total seconds, and how many took over 10 ms."""
    import re

    text = metrics_page(log_path)
    if text is None:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        g = re.match(r'postbacks_gc_pause_seconds_(count|sum)\{generation="(\d)"\} (\S+)', line)
        if g:
            out[f"gen{g.group(2)}_{g.group(1)}"] = float(g.group(3))
        g = re.match(r'postbacks_gc_pause_seconds_bucket\{generation="(\d)",le="0.01"\} (\S+)',
                     line)
        if g:
            out[f"gen{g.group(1)}_upto10ms"] = float(g.group(2))
    for gen in "012":
        if f"gen{gen}_count" in out:
            out[f"gen{gen}_over10ms"] = out[f"gen{gen}_count"] - out.pop(f"gen{gen}_upto10ms", 0.0)
    return out


def partials_written(s: Settings) -> int:
    """Records on anomaly.partials.v1 so far (its end offsets)."""
    from confluent_kafka import TopicPartition

    c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                  "group.id": f"bench-{uuid.uuid4().hex[:8]}"})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(s.topic(TOPICS.anomaly_partials.base),
                                                          p), timeout=10)[1]
                   for p in range(TOPICS.anomaly_partials.partitions))
    finally:
        c.close()


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


def added_latency(s: Settings, n: int, tag: str,
                  series: str | None = None) -> tuple[list[float], list[float], list[float]]:
    """Added latency of every delivery, of those after the first second, and of those in
    the first second (the gate was idle before it)."""
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
                                                             for _, t in slow}))
        + f" (s 0 = {time.strftime('%H:%M:%S', time.gmtime(first / 1000))}"
          f".{first % 1000:03d} UTC)")
    if series:
        Path(series).write_text(json.dumps(sorted((t - first, x) for x, t in worst)))
    return lat, [x for x, t in worst if t - first >= 1000], [x for x, t in worst
                                                             if t - first < 1000]


def _spy(pid: int, out: str, seconds: float, idle: bool = False) -> None:
    """py-spy (on PATH, else beside the interpreter) the process ``pid`` for ``seconds`` into
    ``out`` (raw folded stacks; speedscope, in time order, for a ``.json`` file), in the
    background."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    extra = ["-r", "100", "--idle", "-t"] if idle else ["-r", "200"]
    fmt = "speedscope" if out.endswith(".json") else "raw"  # speedscope keeps sample order
    subprocess.Popen([spy, "record", *extra, "-d", str(int(seconds)), "-f", fmt, "-o", out,
                      "-p", str(pid)])


def prepare(base: Settings, n_endpoints: int) -> tuple[Settings, list[str]]:
    """Fresh topics, a global scope of the run's own, and its endpoints armed (see
    :func:`arm`)."""
    s = fresh(base, "gate")
    s = dataclasses.replace(s, anomaly_global_key=s.instance_id + "-g")
    endpoints = [f"ep_bench_{s.instance_id}_{i}" for i in range(n_endpoints)]
    arm(s, endpoints)
    return s, endpoints


def throughput(s: Settings, stack: Stack, endpoints: list[str], n: int,
               profile: str | None = None) -> dict[str, float]:
    """Part 1: ``n`` deliveries on deliveries.v1, then the gate started (as ``gate`` in
    ``stack``); its rate from its first output to its last, and its CPU per delivery."""
    say(f"gate throughput: producing {n:,} deliveries over {len(endpoints)} endpoints")
    produce(s, n, endpoints, "t")
    t_start = time.time()
    gate = stack.start("gate", "gate")
    if profile:
        _spy(gate.pid, profile, 12)
    got = read_outputs(s, n, timeout=600)
    if len(got) < n:
        raise RuntimeError(f"the gate put out {len(got)} of {n} deliveries\n{gate.tail(20)}")
    wall = time.time() - t_start
    cpu = cpu_s(gate.pid)
    first = min(t for t, _ in got)
    last = max(t for t, _ in got)
    rate = len(got) / max(1e-9, (last - first) / 1000)
    say(f"gate: {len(got):,} outputs, {rate:,.0f} deliveries/s between first and last "
        f"output (wall from process start {wall:.1f}s), CPU {cpu:.1f}s "
        f"= {cpu / len(got) * 1e6:.0f} µs/delivery incl. start-up")
    return {"throughput_per_s": round(rate), "cpu_us_per_delivery": round(cpu / len(got) * 1e6),
            "startup_to_first_output_s": round(first / 1000 - t_start, 2)}


def latency(s: Settings, stack: Stack, endpoints: list[str], rate: float, seconds: float,
            idle_s: float = 2.0, back_to_back: bool = False, profile: str | None = None,
            series: str | None = None) -> dict[str, Any]:
    """Part 2, through the gate :func:`throughput` started: unless ``back_to_back``, wait
    until it has committed everything (its aggregator included) and sat idle ``idle_s``;
    then ``rate`` deliveries/s for ``seconds``, and the latency the gate adds to each."""
    gate = stack.procs["gate"]
    out: dict[str, Any] = {}
    p = warm_producer(s, endpoints)  # before the drain: the gate then sits idle
    if not back_to_back:
        drained = wait_drained(s)
        say(f"gate drained the throughput run {drained:.1f}s after its last dispatch; "
            f"idle for {idle_s:.0f}s")
        out.update(drained_after_s=round(drained, 1), idle_s=idle_s)
        time.sleep(idle_s)
    say(f"gate latency: {rate:.0f}/s for {seconds:.0f}s through the running gate")
    m = int(rate * seconds)
    if profile:
        _spy(gate.pid, profile, seconds + 2, idle=True)
    partials0 = partials_written(s)
    gc0 = gc_pauses(gate.log_path)
    cpu0 = cpu_s(gate.pid)
    produce(s, m, endpoints, "l", rate=rate, p=p)
    lat, steady, first_s = added_latency(s, m, "l", series)
    if len(lat) < m:
        raise RuntimeError(f"the gate dispatched {len(lat)} of {m} deliveries")
    cpu_lat = (cpu_s(gate.pid) - cpu0) / m * 1e6
    per_delivery = (partials_written(s) - partials0) / m
    gc1 = gc_pauses(gate.log_path)
    pauses = {k: round(gc1.get(k, 0.0) - gc0.get(k, 0.0), 4) for k in gc1}
    say(f"during the latency run: {cpu_lat:.0f} µs CPU per delivery, "
        f"{per_delivery:.3f} partials written per delivery; GC pauses: "
        + ", ".join(f"{k} {v}" for k, v in sorted(pauses.items())))
    p50, p99 = pct(lat, 50), pct(lat, 99)
    say(f"gate added latency over {len(lat):,} deliveries: p50 {p50:.0f} ms, "
        f"p99 {p99:.0f} ms, max {max(lat):.0f} ms; after the first second: "
        f"p50 {pct(steady, 50):.0f} ms, p99 {pct(steady, 99):.0f} ms; first second: "
        f"p99 {pct(first_s, 99):.0f} ms, max {max(first_s):.0f} ms")
    return out | {"gc_pauses_during_latency_run": pauses,
                  "latency_run_cpu_us_per_delivery": round(cpu_lat),
                  "partials_per_delivery": round(per_delivery, 4),
                  "latency_p50_ms": p50, "latency_p99_ms": p99, "latency_n": len(lat),
                  "latency_rate": rate, "steady_p50_ms": pct(steady, 50),
                  "steady_p99_ms": pct(steady, 99), "first_second_p99_ms": pct(first_s, 99),
                  "first_second_max_ms": max(first_s)}


def run(base: Settings, n: int, rate: float | Callable[[dict[str, float]], float],
        seconds: float, log_dir: Path, *, n_endpoints: int = 300,
        env: dict[str, str] | None = None, idle_s: float = 2.0, back_to_back: bool = False,
        profile: str | None = None, profile_latency: str | None = None,
        series: str | None = None) -> dict[str, Any]:
    """:func:`throughput` then :func:`latency` (unless ``seconds`` is 0) through one gate
    process; ``rate`` may be a function of the throughput figures. Topics deleted after."""
    s, endpoints = prepare(base, n_endpoints)
    try:
        gate_env = env_for(s, POSTBACKS_ANOMALY_GLOBAL_KEY=s.anomaly_global_key, **(env or {}))
        with Stack(gate_env, log_dir) as stack:
            out: dict[str, Any] = dict(throughput(s, stack, endpoints, n, profile))
            if seconds <= 0:
                say("no latency run (seconds 0)")
                return out
            at = rate(out) if callable(rate) else rate
            return out | latency(s, stack, endpoints, at, seconds, idle_s, back_to_back,
                                 profile_latency, series)
    finally:
        delete_prefixed_topics(s, s.topic_prefix)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="deliveries for the throughput run")
    ap.add_argument("--rate", type=float, default=2000, help="deliveries/s for the latency run")
    ap.add_argument("--seconds", type=float, default=10, help="length of the latency run")
    ap.add_argument("--endpoints", type=int, default=300)
    ap.add_argument("--commit-s", help="POSTBACKS_GATE_COMMIT_INTERVAL_S for the gate")
    ap.add_argument("--partials-s",
                    help="POSTBACKS_GATE_PARTIALS_INTERVAL_S for the gate (0: after every batch)")
    ap.add_argument("--profile", metavar="FILE", help="py-spy the gate during the throughput run")
    ap.add_argument("--profile-latency", metavar="FILE",
                    help="py-spy the gate (with idle frames) during the latency run")
    ap.add_argument("--idle-s", type=float, default=2.0,
                    help="seconds the gate sits idle (after it drained the throughput run, "
                         "its aggregator included) before the latency run")
    ap.add_argument("--back-to-back", action="store_true",
                    help="start the latency run as soon as the throughput run's last output is "
                         "read (the gate is then still finishing that run's aggregation)")
    ap.add_argument("--series", metavar="FILE",
                    help="write [ms since the first input, added latency ms] of the latency run")
    args = ap.parse_args()
    base = load_settings()
    migrate(base.database_url)
    extra = {"POSTBACKS_GATE_COMMIT_INTERVAL_S": args.commit_s} if args.commit_s else {}
    if args.partials_s is not None:
        extra["POSTBACKS_GATE_PARTIALS_INTERVAL_S"] = args.partials_s
    results: dict[str, Any] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    results |= run(base, args.n, args.rate, args.seconds,
                   ROOT / ".local" / "bench-logs" / f"gate-{int(time.time())}",
                   n_endpoints=args.endpoints, env=extra, idle_s=args.idle_s,
                   back_to_back=args.back_to_back, profile=args.profile,
                   profile_latency=args.profile_latency, series=args.series)
    out = ROOT / "bench" / "results" / "gate-latest.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    say(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
