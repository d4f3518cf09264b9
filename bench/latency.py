"""The delivery benchmark's latency parts (bench/delivery.py runs them): conversion ->
postback latency through the whole pipeline at a steady rate, the relay's lateness
against due_at, and healthy-endpoint latency with and without a 15-s endpoint on the same
partition. Bounded in count and time; traffic to 127.0.0.1 only."""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from bench.harness import (
    DispatchWriter,
    arrived,
    endpoints_for,
    env_for,
    fast_receiver,
    fresh,
    own_cpu_s,
    pct,
    say,
    service_pids,
    tree_cpu,
    tree_cpu_since,
)
from postbacks.codec import codec_for
from postbacks.core.endpoint import Endpoint
from postbacks.core.fanout import plan_deliveries
from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.records import ConversionEvent
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from topics import TOPICS


class HopWatch:
    """When each delivery became visible to a read_committed reader of ``deliveries.v1``
    (fan-out's commit) and of ``dispatch.v1`` (the gate's output), by idempotency key: the
    latency split by hop. A thread per topic, polling; it adds two light consumers."""

    def __init__(self, s: Settings, names: tuple[str, ...] = ("deliveries", "dispatch")) -> None:
        bases = {"deliveries": TOPICS.deliveries.base, "dispatch": TOPICS.dispatch.base}
        self.seen: dict[str, dict[str, float]] = {name: {} for name in names}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(s, name, bases[name]),
                                          daemon=True) for name in names]
        for t in self._threads:
            t.start()

    def _run(self, s: Settings, name: str, base: str) -> None:
        from confluent_kafka import Consumer

        codec = codec_for("Delivery")
        seen = self.seen[name]
        c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                      "group.id": f"bench-hops-{name}-{time.time_ns()}",
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                      "fetch.wait.max.ms": 5, "enable.auto.commit": False})
        c.subscribe([s.topic(base)])
        try:
            while not self._stop.is_set():
                # one record's wait, then what is already fetched: consume(500, t) would
                # wait out t below 500 records (postbacks.kafka.clients.consume_ready)
                first = c.consume(1, 0.05)
                for m in first + (c.consume(499, 0) if first else []):
                    if m.error() is None and m.value():
                        t = time.time()
                        seen.setdefault(codec.decode(m.value())["idempotency_key"], t)
        finally:
            c.close()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)


def run_pipeline_latency(base: Settings, rate: float, seconds: float, log_dir: Path,
                         seed: int) -> dict[str, float]:
    """Conversion -> postback latency through the whole pipeline at a steady ``rate``: for
    each delivery, its arrival at the receiver minus the moment its conversion was handed
    to the producer (one host clock)."""
    s = fresh(base, "lat")
    with fast_receiver() as (url, rx):
        ns = s.instance_id.replace("-", "")
        seeded = seed_endpoints(s, apps=20, endpoints_per_app=1, receiver_url=url,
                                namespace=ns, now_ms=int(time.time() * 1000))
        by_app = {e.app_id: e for e in endpoints_for(s, seeded)}
        idem = s.idempotency_key.reveal().encode()
        n = int(rate * seconds)
        n_warm = int(rate * WARM_S)
        events = list(synthetic_conversions(n_warm + n + 1, apps=20, seed=seed, namespace=ns,
                                            now_ms=int(time.time() * 1000)))
        with Stack(env_for(s), log_dir) as stack:
            for stage in ("sink", "agent", "gate", "fanout"):
                stack.start(stage, stage)
            producer = ConversionProducer(s)
            producer.send(events[0])  # through every stage once before the timed traffic
            producer.flush()
            wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 90, interval=0.05,
                     what="the warm-up delivery")
            hops = HopWatch(s)
            time.sleep(5.0)  # consumer groups settled (a late rebalance stalls ~1 s)

            def paced(batch: list[ConversionEvent]) -> dict[str, float]:
                sent: dict[str, float] = {}
                start = time.perf_counter()
                for i, ev in enumerate(batch):
                    while time.perf_counter() < start + i / rate:
                        time.sleep(0.0005)
                    keys = [d["idempotency_key"] for d in plan_deliveries(
                        ev, [by_app[ev["app_id"]]], idem_key=idem,
                        now_ms=int(time.time() * 1000))]
                    t = time.time()
                    producer.send(ev)
                    for k in keys:
                        sent[k] = t
                return sent

            # WARM_S of the same traffic first, not timed: every partition of the run's
            # fresh topics past its first index entry (see WARM_S)
            warm = paced(events[1:n_warm + 1])
            producer.flush()
            wait_for(lambda: arrived(url, warm), 120, what=f"{len(warm)} warm-up deliveries")
            pids = {name: p.pid for name, p in stack.procs.items()} | service_pids() | {
                "receiver": rx.pid}
            cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
            own0, t_cpu = own_cpu_s(), time.perf_counter()
            sent = paced(events[n_warm + 1:])
            producer.flush()
            wait_for(lambda: arrived(url, sent), 120,
                     what=f"{len(sent)} deliveries")
            wall = time.perf_counter() - t_cpu
            load = {name: tree_cpu_since(pid, cpu0[name]) / wall for name, pid in pids.items()}
            load["bench"] = (own_cpu_s() - own0) / wall
            times = http_json(f"{url}/_times")
            hops.close()
            txn = {name: _txn_means(stack.procs[name].metrics() or "")
                   for name in ("fanout", "agent")}
        lat = [(times[k] - t) * 1000 for k, t in sent.items()]
        split = _hops(sent, hops.seen, times)
        t0 = min(sent.values())
        slow = sorted(((times[k] - t) * 1000, t - t0) for k, t in sent.items())[-len(lat) // 100:]
        say(f"pipeline latency at {rate:.0f} conversions/s over {len(lat)} deliveries: "
            f"p50 {pct(lat, 50):.0f} ms, p99 {pct(lat, 99):.0f} ms, max {max(lat):.0f} ms; "
            "the slowest 1% sent at s " + ", ".join(sorted({f"{x:.1f}" for _, x in slow}))
            + f" of the timed traffic (from {time.strftime('%H:%M:%S', time.localtime(t0))}"
            f".{int(t0 * 1000) % 1000:03d}, this host's clock)")
        say("by hop (p50 / p99 ms): " + "; ".join(
            f"{name} {pct(v, 50):.0f} / {pct(v, 99):.0f}" for name, v in split.items() if v))
        say("cores used during the timed traffic: " + ", ".join(
            f"{name} {v:.2f}" for name, v in load.items()) + f"; all {sum(load.values()):.2f}"
            f" of {os.cpu_count()} (bench: this process, its producer and hop readers)")
        say("transactions (mean ms: offset send / commit; count): " + "; ".join(
            f"{name} {m.get('offsets', (0.0, 0))[0]:.1f} / {m.get('commit', (0.0, 0))[0]:.1f}; "
            f"{m.get('commit', (0.0, 0))[1]}" for name, m in txn.items()))
        return {"pipeline_latency_rate": rate, "pipeline_latency_p50_ms": pct(lat, 50),
                "pipeline_latency_p99_ms": pct(lat, 99), "pipeline_latency_max_ms": max(lat),
                **{f"pipeline_latency_{name}_p50_ms": pct(v, 50)
                   for name, v in split.items() if v},
                **{f"pipeline_latency_{name}_p99_ms": pct(v, 99)
                   for name, v in split.items() if v}}


def _txn_means(page: str) -> dict[str, tuple[float, int]]:
    """From a stage's /metrics page: per step of ``postbacks_transaction_seconds``, the mean
    in ms and the count, since the process started (the warm-up's transactions included)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in page.splitlines():
        if not line.startswith("postbacks_transaction_seconds_"):
            continue
        name, _, value = line.rpartition(" ")
        step = name.split('step="', 1)[1].split('"', 1)[0] if 'step="' in name else ""
        if name.startswith("postbacks_transaction_seconds_sum"):
            sums[step] = float(value)
        elif name.startswith("postbacks_transaction_seconds_count"):
            counts[step] = int(float(value))
    return {k: (sums[k] / counts[k] * 1000, counts[k]) for k in sums if counts.get(k)}


def _hops(sent: dict[str, float], seen: dict[str, dict[str, float]],
          times: dict[str, float]) -> dict[str, list[float]]:
    """Per delivery, ms spent in each hop: conversion sent -> visible on deliveries.v1
    (fan-out), -> visible on dispatch.v1 (gate), -> received (agent)."""
    out: dict[str, list[float]] = {"fanout": [], "gate": [], "agent": []}
    for k, t in sent.items():
        a, b, c = seen["deliveries"].get(k), seen["dispatch"].get(k), times.get(k)
        if a is None or b is None or c is None:
            continue
        out["fanout"].append((a - t) * 1000)
        out["gate"].append((b - a) * 1000)
        out["agent"].append((c - b) * 1000)
    return out


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
        relay = stack.start("relay", "relay")
        cpu0: dict[int, float] | None = None  # from the first republished delivery on
        c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers, "group.id": "bench-lat",
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
        c.subscribe([s.topic(TOPICS.dispatch.base)])
        late: list[float] = []
        early = 0
        deadline = time.monotonic() + 120
        while len(late) < n and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if cpu0 is None:
                    cpu0, first = tree_cpu(relay.pid), len(late)
                if m.error() is None:
                    d = codec.decode(m.value())
                    delta = d["enqueued_at"] - d["due_at"]
                    early += delta < 0
                    late.append(delta)
        cpu = tree_cpu_since(relay.pid, cpu0) if cpu0 is not None else float("nan")
        c.close()
    per = cpu / max(1, len(late) - first) * 1e6 if cpu0 is not None else float("nan")
    say(f"relay: {per:.0f} µs CPU per delivery republished (at 500/s, idle polling included)")
    say(f"relay lateness over {len(late)}: p50 {pct(late, 50):.0f} ms, p99 {pct(late, 99):.0f} ms,"
        f" early {early}")
    return {"relay_lateness_p50_ms": pct(late, 50), "relay_lateness_p99_ms": pct(late, 99),
            "relay_early": float(early), "cpu_us_relay": per}


WARM_S = 2.0
"""Seconds of the same traffic sent, and delivered, before a latency part's timed traffic.
Every run has fresh topics, and on this machine's ext4 the first index entry of a new log
segment (after its first 4 KiB, ``index.interval.bytes``), where the broker first touches
the segment's sparse, memory-mapped index files, is slow: appends to the partition wait
40-50 ms each, in a staircase across partitions, about 0.2 s into the traffic. A topic
written before shows none of it (docs/performance.md). In production it happens once per
segment roll."""

ISO_WAVE_S = 0.05  # one delivery per healthy endpoint every 50 ms: 400/s
ISO_S = 20.0  # per run: 8,000 healthy deliveries (at 10 s, one stall of 0.1 s made the p99)
ISO_SLOW_EVERY = 10  # with the slow endpoint: one delivery to it every 0.5 s


def run_isolation(base: Settings, with_slow: bool, log_dir: Path,
                  seconds: float = ISO_S) -> float:
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
            hops = HopWatch(s, ("dispatch",))
            # warm up: the agent has joined its group and delivered once before measuring,
            # and the hop watcher has read the record
            first = writer.send(healthy[:1], 1, seed=10_000_000, partition=0)
            wait_for(lambda: arrived(url, first) and set(first) <= set(hops.seen["dispatch"]),
                     60, interval=0.05, what="warm-up delivery")

            def waves(count: int, seed: int) -> dict[str, int]:
                keys: dict[str, int] = {}
                t0 = time.monotonic()
                for i in range(count):  # on an absolute schedule: no drift
                    if with_slow and i % ISO_SLOW_EVERY == 0:
                        writer.send([slow], 1, seed=seed + 20_000_000 + i, partition=0,
                                    flush=False)
                    keys.update(writer.send(healthy, 1, seed=seed + i + 1, partition=0,
                                            flush=False))
                    time.sleep(max(0.0, t0 + (i + 1) * ISO_WAVE_S - time.monotonic()))
                return keys

            warm = waves(int(WARM_S / ISO_WAVE_S), 30_000_000)  # not timed: see WARM_S
            wait_for(lambda: arrived(url, warm), 120, what="warm-up deliveries")
            wall0 = time.time() * 1000
            keys = waves(max(1, round(seconds / ISO_WAVE_S)), 0)
            writer.close()
            wait_for(lambda: arrived(url, keys), 120,
                     what="healthy deliveries")
            times = http_json(f"{url}/_times")
            hops.close()
            by_key = {k: times[k] * 1000 - t for k, t in keys.items()}
            lat = list(by_key.values())
            seen = hops.seen["dispatch"]
            to_agent = [seen[k] * 1000 - t for k, t in keys.items() if k in seen]
            in_agent = [(times[k] - seen[k]) * 1000 for k in keys if k in seen]
            worst = sorted(keys, key=by_key.__getitem__)[-len(keys) // 100:]
            at = sorted((keys[k] - wall0) / 1000 for k in worst)
            say(f"  by hop: produced -> on dispatch.v1 p50 {pct(to_agent, 50):.0f} / p99 "
                f"{pct(to_agent, 99):.0f} ms, -> received p50 {pct(in_agent, 50):.0f} / p99 "
                f"{pct(in_agent, 99):.0f} ms; the slowest 1% produced {at[0]:.1f}-{at[-1]:.1f} s "
                f"into the run")
            # the slow endpoint's requests, each held 15 s (its concurrency cap at a time)
            stats = http_json(f"{url}/_stats")
            slow_seen = stats["slow"]
            extra = stats["count"] - slow_seen - len(keys) - len(first) - len(warm)
        if with_slow and slow_seen < 1:
            raise RuntimeError("the slow endpoint received no request: nothing was measured")
        p99 = pct(lat, 99)
        say(f"healthy p99 {'with' if with_slow else 'without'} a 15-s endpoint: {p99:.0f} ms "
            f"(p50 {statistics.median(lat):.0f} ms, max {max(lat):.0f} ms, "
            f"{len(lat)} deliveries; requests to the slow endpoint {slow_seen}, healthy "
            f"re-sends {extra})")
        return p99


def run_isolation_pairs(base: Settings, pairs: int, log_dir: Path,
                        seconds: float = ISO_S) -> dict[str, float]:
    """Alternating without/with runs of :func:`run_isolation`: a p99 of ~1,000 ms-scale
    samples on a shared 2-core machine moves by tens of ms from run to run; the median pair
    says more than one pair, and the worst pair bounds the rest."""
    ratios, withouts, withs = [], [], []
    for i in range(pairs):
        without = run_isolation(base, False, log_dir / f"iso0-{i}", seconds)
        with_slow = run_isolation(base, True, log_dir / f"iso1-{i}", seconds)
        withouts.append(without)
        withs.append(with_slow)
        ratios.append(with_slow / without)
        say(f"isolation pair {i + 1}/{pairs}: {without:.0f} / {with_slow:.0f} ms = "
            f"{with_slow / without:.2f}")
    return {"healthy_p99_ms_without_slow": statistics.median(withouts),
            "healthy_p99_ms_with_slow": statistics.median(withs),
            "isolation_ratio": statistics.median(ratios),
            "isolation_ratio_min": min(ratios), "isolation_ratio_max": max(ratios),
            "isolation_pairs": float(len(ratios))}
