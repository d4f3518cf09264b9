"""The delivery benchmark's latency parts (bench/delivery.py runs them): conversion ->
postback latency through the whole pipeline at a steady rate, the relay's lateness
against due_at, and healthy-endpoint latency with and without a 15-s endpoint on the same
partition. Bounded in count and time; traffic to 127.0.0.1 only."""

from __future__ import annotations

import statistics
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
    pct,
    say,
    tree_cpu,
    tree_cpu_since,
)
from postbacks.codec import codec_for
from postbacks.core.endpoint import Endpoint
from postbacks.core.fanout import plan_deliveries
from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from topics import TOPICS


def run_pipeline_latency(base: Settings, rate: float, seconds: float, log_dir: Path,
                         seed: int) -> dict[str, float]:
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
        events = list(synthetic_conversions(n + 1, apps=20, seed=seed, namespace=ns,
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


def run_isolation_pairs(base: Settings, pairs: int, log_dir: Path) -> dict[str, float]:
    """Alternating without/with runs of :func:`run_isolation`: a p99 of ~1,000 ms-scale
    samples on a shared 2-core machine moves by tens of ms from run to run; the median pair
    says more than one pair, and the worst pair bounds the rest."""
    ratios, withouts, withs = [], [], []
    for i in range(pairs):
        without = run_isolation(base, False, log_dir / f"iso0-{i}")
        with_slow = run_isolation(base, True, log_dir / f"iso1-{i}")
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
