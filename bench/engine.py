"""The delivery engine end to end: a backlog of deliveries -> agent -> signed POST ->
attempt + outcome records -> sink -> PostgreSQL, until every delivery is on record there as
``delivered`` with its attempt counted (part ``engine`` of ``bench/delivery.py``).

The backlog is what fan-out and the gate hand the engine: each delivery on deliveries.v1
(the sink records the delivery row from it) and on dispatch.v1 (the agent sends it). The
stages upstream of the engine (fan-out, the anomaly gate) are not running here; the whole
pipeline is part ``e2e``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from bench.harness import (
    DispatchWriter,
    broker_partitions,
    endpoints_for,
    env_for,
    fast_receiver,
    fresh,
    own_cpu_s,
    say,
    service_pids,
    tree_cpu,
    tree_cpu_since,
)
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, metrics_page, wait_for
from postbacks.tools.seed import seed_endpoints

__all__ = ["run_engine"]

_ON_RECORD = ("SELECT count(*) FROM deliveries WHERE endpoint_id = ANY(%s) "
              "AND status = 'delivered' AND attempt_count >= 1")


def _sink_rows(log_path: Path) -> dict[str, float]:
    """Rows the sink has written, by table (``postbacks_sink_rows_total``)."""
    text = metrics_page(log_path) or ""
    out: dict[str, float] = {}
    for m in re.finditer(r'^postbacks_sink_rows_total\{table="(\w+)"\} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def _steady_rate(samples: list[tuple[float, float]], n: int) -> float:
    """Rows on record per second while the run is in full flow: between the samples where
    the sink had written 20 % and 80 % of the ``n`` deliveries. The whole run's rate (first
    postback to last row) also holds the ramp-up and the last transaction's way to the
    table (a fixed 0.2-0.9 s here, a tenth of a 20,000-delivery run)."""
    lo = next((t, c) for t, c in samples if c >= 0.2 * n)
    hi = next((t, c) for t, c in samples if c >= 0.8 * n)
    return (hi[1] - lo[1]) / (hi[0] - lo[0]) if hi[0] > lo[0] else float("nan")


def _assigned(s: Settings, group: str) -> bool:
    """Whether ``group`` is stable with partitions assigned to its members."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap_servers})
    try:
        desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
    except Exception:  # not there yet
        return False
    return bool(desc.state == ConsumerGroupState.STABLE
                and any(m.assignment.topic_partitions for m in desc.members))


def run_engine(base: Settings, n: int, n_endpoints: int, seed: int,
               log_dir: Path, catch_up: bool = False) -> dict[str, float]:
    """Steady state (default): the sink and the agent are running when the backlog is
    produced, as behind fan-out and the gate; every process's CPU is counted from before
    the backlog, per delivery. ``catch_up``: both start after the backlog is on the topics
    (a sink catching up after a restart projects every row it reads, see
    ``postbacks.sinks.waiting``); CPU from the first postback. The rate is always from the
    first postback to the last row on record."""
    s = fresh(base, "engine")
    with fast_receiver() as (url, rx):
        ns = s.instance_id.replace("-", "")
        seeded = seed_endpoints(s, apps=n_endpoints, endpoints_per_app=1, receiver_url=url,
                                namespace=ns, now_ms=int(time.time() * 1000))
        eps = endpoints_for(s, seeded)
        ep_ids = [e.endpoint_id for e in eps]
        with Stack(env_for(s), log_dir) as stack, connect(s.database_url,
                                                          autocommit=True) as db:

            def start() -> dict[str, int]:
                for stage in ("sink", "agent"):
                    stack.start(stage, stage)
                for stage in ("sink", "agent"):  # both started up and given partitions
                    group = s.topic(f"postbacks-{stage}")
                    wait_for(lambda g=group: _assigned(s, g), 60, interval=0.2,
                             what=f"the {stage}'s partitions")
                sink_log = stack.procs["sink"].log_path  # ... and the sink has read their ends
                wait_for(lambda: "sink: assigned" in sink_log.read_text(errors="replace"), 30,
                         interval=0.05, what="the sink's assignment")
                return ({name: p.pid for name, p in stack.procs.items()}
                        | {"receiver": rx.pid} | service_pids())

            writer = DispatchWriter(s)
            backlog = list(writer.records(eps, n // n_endpoints, seed=seed,
                                          also_deliveries=True))
            cpu0: dict[str, float] = {}
            if not catch_up:
                pids = start()
                cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
            say(f"engine: producing {n} deliveries over {n_endpoints} endpoints to "
                f"deliveries.v1 and dispatch.v1"
                f"{' (sink and agent not running)' if catch_up else ''} ...")
            own0 = own_cpu_s()
            writer.produce(backlog)
            writer.close()
            own = own_cpu_s() - own0
            n = (n // n_endpoints) * n_endpoints
            if catch_up:
                pids = start()
            wait_for(lambda: http_json(f"{url}/_stats")["count"] > 0, 60, interval=0.01,
                     what="first delivery")
            t0 = time.perf_counter()
            c0 = http_json(f"{url}/_stats")["count"]
            if catch_up:
                cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
            counted = n - c0 if catch_up else n
            # On record: the sink's own count of rows written (its /metrics), so the check
            # adds no PostgreSQL work to the timed window (a count over the run's rows, whose
            # heap pages lie scattered over a large table, took ~1 s of PostgreSQL per check).
            # Sampled through the run for the steady rate (see _steady_rate).
            sink_log = stack.procs["sink"].log_path
            samples: list[tuple[float, float]] = []
            sent_s = 0.0

            def on_record() -> bool:
                nonlocal sent_s
                written = _sink_rows(sink_log)
                samples.append((time.perf_counter() - t0,
                                min(written.get(t, 0.0) for t in ("deliveries", "attempts",
                                                                  "outcomes"))))
                if not sent_s and http_json(f"{url}/_stats")["count"] >= n:
                    sent_s = time.perf_counter() - t0
                return bool(sent_s) and samples[-1][1] >= n

            wait_for(on_record, 300, interval=0.1, what=f"{n} deliveries on record")
            elapsed = time.perf_counter() - t0
            share = {name: tree_cpu_since(pid, cpu0[name]) / counted * 1e6
                     for name, pid in pids.items()}
            # ... and checked once, untimed: every one is delivered, its attempt counted
            db.execute("SET jit = off")
            row = db.execute(_ON_RECORD, (ep_ids,)).fetchone()
            if row is None or row[0] < n:
                raise RuntimeError(f"only {row and row[0]} of {n} deliveries are on record as "
                                   "delivered with their attempt counted")
            # the figures depend on how much the tables already hold (index depth, cache)
            size = db.execute("SELECT (SELECT reltuples FROM pg_class"
                              "  WHERE oid = 'deliveries'::regclass),"
                              " pg_database_size(current_database())").fetchone()
        rate = (n - c0) / elapsed
        steady = _steady_rate(samples, n)
        if size is not None:
            say(f"engine: the database holds ~{max(0, size[0]):,.0f} delivery rows, "
                f"{size[1] / 2**30:.1f} GiB; the broker {broker_partitions(s):,} partitions "
                "(an idle broker spends CPU on every one: ~15 % of a core at 4,400)")
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(share.items(), key=lambda x: -x[1]))
        say(f"engine end to end{' (catching up)' if catch_up else ''}: {rate:.0f} "
            f"deliveries/s on record in PostgreSQL from the first postback to the last row, "
            f"{steady:.0f}/s steady (rows 20-80 %) "
            f"({(n - c0) / sent_s:.0f}/s sent; the last on record {elapsed - sent_s:.2f} s "
            f"after the last sent); CPU µs per delivery by process: {cpu}; "
            f"total {sum(share.values()):.0f} (not counted: the bench producing the "
            f"prepared backlog, {own / n * 1e6:.0f})")
        return {"engine_end_to_end_per_s": rate, "engine_steady_per_s": steady,
                "engine_sent_per_s": (n - c0) / sent_s,
                "engine_end_to_end_cpu_us_per_delivery": sum(share.values())}
