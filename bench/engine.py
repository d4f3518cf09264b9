"""The delivery engine end to end: a backlog of deliveries -> agent -> signed POST ->
attempt + outcome records -> sink -> PostgreSQL, until every delivery is on record there as
``delivered`` with its attempt counted (part ``engine`` of ``bench/delivery.py``).

The backlog is what fan-out and the gate hand the engine: each delivery on deliveries.v1
(the sink records the delivery row from it) and on dispatch.v1 (the agent sends it). The
stages upstream of the engine (fan-out, the anomaly gate) are not running here; the whole
pipeline is part ``e2e``.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from pathlib import Path
from typing import Any

from bench.harness import (
    DispatchWriter,
    Prepared,
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
from sinks.tables import ts_from_ms

__all__ = ["FELL_BEHIND", "KEPT_UP", "assigned", "lag_trend", "run_engine", "verdict"]

_ON_RECORD = ("SELECT count(*) FROM deliveries WHERE endpoint_id = ANY(%s) "
              "AND created_at >= %s AND status = 'delivered' AND attempt_count >= 1")


def _sink_rows(log_path: Path) -> dict[str, float]:
    """Rows the sink has written, by table (``postbacks_sink_rows_total``)."""
    text = metrics_page(log_path) or ""
    out: dict[str, float] = {}
    for m in re.finditer(r'^postbacks_sink_rows_total\{table="(\w+)"\} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def _check_on_record(s: Settings, db: Any, ep_ids: list[str], since_ms: int, n: int) -> None:
    """Checked once, untimed: every delivery of this run (its endpoints, which every run of
    the part shares, and created since ``since_ms``, when its backlog was planned) is a
    ``delivered`` row with its attempt counted. Then what the figures depend on: how much
    the tables already hold (index depth, cache) and how many partitions the broker
    keeps."""
    db.execute("SET jit = off")
    row = db.execute(_ON_RECORD, (ep_ids, ts_from_ms(since_ms))).fetchone()
    if row is None or row[0] < n:
        raise RuntimeError(f"only {row and row[0]} of {n} deliveries are on record as "
                           "delivered with their attempt counted")
    size = db.execute("SELECT (SELECT reltuples FROM pg_class"
                      "  WHERE oid = 'deliveries'::regclass),"
                      " pg_database_size(current_database())").fetchone()
    say(f"engine: the database holds ~{max(0, size[0]):,.0f} delivery rows, "
        f"{size[1] / 2**30:.1f} GiB; the broker {broker_partitions(s):,} partitions "
        "(an idle broker spends CPU on every one: ~15 % of a core at 4,400)")


def _host_busy() -> tuple[int, int]:
    """(all, idle) jiffies of the host since boot (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(f), f[3] + f[4]


def _paced(s: Settings, sink_log: Path, writer: DispatchWriter, backlog: list[Prepared],
           offered: float, pids: dict[str, int], cpu0: dict[str, dict[int, float]], db: Any,
           ep_ids: list[str], since_ms: int) -> dict[str, float]:
    """Produce ``backlog`` at ``offered`` deliveries/s on an absolute schedule (no drift),
    sampling the rows on record every 0.25 s; then wait for the last row, and judge
    (:func:`verdict`) whether the engine kept up. The bench's producer is not
    transactional, so each delivery is readable at once; fan-out's and the gate's come in
    100-ms transactions."""
    n = len(backlog)
    say(f"engine: offering {n} deliveries at {offered:.0f}/s ({n / offered:.1f} s) ...")
    busy0, own0 = _host_busy(), own_cpu_s()
    t0 = time.perf_counter()
    done, next_sample = 0, 0.25
    lags: list[tuple[float, float]] = []  # (s into the run, deliveries produced - on record)
    while done < n:
        now = time.perf_counter() - t0
        due = min(n, int(now * offered) + 1)
        if due > done:
            writer.produce(backlog[done:due], flush=False)
            done = due
        if now >= next_sample:
            next_sample += 0.25
            lags.append((now, done - _on_record_count(sink_log)))
        time.sleep(0.005)  # ~20 deliveries a tick at 4,000/s
    writer.close()
    produced_s = time.perf_counter() - t0
    own = own_cpu_s() - own0
    wait_for(lambda: _on_record_count(sink_log) >= n, 300, interval=0.05,
             what=f"{n} deliveries on record")
    elapsed = time.perf_counter() - t0
    busy1 = _host_busy()
    busy = 1 - (busy1[1] - busy0[1]) / max(1, busy1[0] - busy0[0])
    share = {name: tree_cpu_since(pid, cpu0[name]) / n * 1e6 for name, pid in pids.items()}
    _check_on_record(s, db, ep_ids, since_ms, n)
    cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(share.items(), key=lambda x: -x[1]))
    lag_at, lag_max = max(lags, key=lambda x: x[1])
    trend, error = lag_trend(lags)
    said = verdict(trend, error, offered, n / produced_s)
    say(f"engine at {offered:.0f}/s offered: produced at {n / produced_s:.0f}/s; rows on "
        f"record at most {lag_max:.0f} deliveries ({lag_max / offered:.2f} s) behind those "
        f"produced (at {lag_at:.1f} s); the lag's trend over the second half {trend:+.0f} "
        f"± {error:.0f} deliveries/s: {said}; the last on record "
        f"{elapsed - produced_s:.2f} s after the last produced; {n / elapsed:.0f}/s from the "
        f"first produced to the last on record; host {busy:.0%} busy (the bench's producing "
        f"included); CPU µs per delivery by process: {cpu}; total "
        f"{sum(share.values()):.0f} (not counted: the bench producing, {own / n * 1e6:.0f})")
    return {"engine_offered_per_s": offered, "engine_paced_produced_per_s": n / produced_s,
            "engine_paced_kept_up": float(said == KEPT_UP),
            "engine_paced_fell_behind": float(said == FELL_BEHIND),
            "engine_paced_lag_trend_per_s": trend, "engine_paced_lag_trend_error_per_s": error,
            "engine_paced_lag_max_s": lag_max / offered,
            "engine_paced_drain_s": elapsed - produced_s,
            "engine_paced_host_busy": busy,
            "engine_paced_cpu_us_per_delivery": sum(share.values())}


KEPT_UP = "KEPT UP"
FELL_BEHIND = "FELL BEHIND"


def lag_trend(lags: list[tuple[float, float]]) -> tuple[float, float]:
    """How fast the lag grew over the second half of the run, in deliveries per second: the
    least-squares slope, and its standard error. An engine short of the offered rate by
    X/s falls X deliveries further behind every second; one that keeps up holds its lag
    level, at the pipeline's own latency (the agent's 100-ms transactions, the sink's
    fetch wait), give or take the sink's batches (a few hundred rows at a time). The
    first half holds the start-up, and a catch-up from it there would hide a shortfall
    after it in one fit over the whole run."""
    half = [(t, lag) for t, lag in lags if t >= lags[-1][0] / 2]
    if len(half) < 16:
        raise ValueError("too few lag samples: run the paced part for at least 10 s")
    ts, ys = [t for t, _ in half], [lag for _, lag in half]
    fit = statistics.linear_regression(ts, ys)
    residual = sum((y - fit.intercept - fit.slope * t) ** 2 for t, y in half)
    spread = sum((t - statistics.fmean(ts)) ** 2 for t in ts)
    return fit.slope, math.sqrt(residual / (len(half) - 2) / spread)


def verdict(trend: float, error: float, offered: float, produced: float) -> str:
    """KEPT UP when the lag's trend is under 2 % of the offered rate by two standard errors;
    FELL BEHIND when the trend itself is over it; UNDECIDED between. A bench that could not
    produce at 98 % of the offered rate offered less than it says: nothing is judged."""
    if produced < 0.98 * offered:
        return f"NOT JUDGED (the bench produced at {produced:.0f}/s, under 98 % of {offered:.0f})"
    limit = 0.02 * offered
    if trend >= limit:
        return FELL_BEHIND
    return KEPT_UP if trend + 2 * error < limit else "UNDECIDED"


def _on_record_count(sink_log: Path) -> float:
    """Deliveries on record: the fewest rows the sink has written to any of its three
    tables (each delivery is one row in each)."""
    written = _sink_rows(sink_log)
    return min(written.get(t, 0.0) for t in ("deliveries", "attempts", "outcomes"))


def assigned(s: Settings, group: str) -> bool:
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
               log_dir: Path, catch_up: bool = False,
               offered: float | None = None) -> dict[str, float]:
    """Steady state (default): the sink and the agent are running when the backlog is
    produced, as behind fan-out and the gate; every process's CPU is counted from before
    the backlog, per delivery. ``catch_up``: both start after the backlog is on the topics
    (a sink catching up after a restart projects every row it reads, see
    ``sinks.waiting``); CPU from the first postback. The rate is always from the
    first postback to the last row on record.

    ``offered``: instead of a backlog, the deliveries are produced at this steady rate (as
    fan-out would hand them on), and the part says whether the engine kept up: how far the
    rows on record fell behind the deliveries produced, and how long after the last one
    produced the last row landed (see :func:`_paced`)."""
    if catch_up and offered is not None:
        raise ValueError("an offered rate needs the engine running: not with catch_up")
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
                    wait_for(lambda g=group: assigned(s, g), 60, interval=0.2,
                             what=f"the {stage}'s partitions")
                sink_log = stack.procs["sink"].log_path  # ... and the sink has read their ends
                wait_for(lambda: "sink: assigned" in sink_log.read_text(errors="replace"), 30,
                         interval=0.05, what="the sink's assignment")
                return ({name: p.pid for name, p in stack.procs.items()}
                        | {"receiver": rx.pid} | service_pids())

            writer = DispatchWriter(s)
            since_ms = int(time.time() * 1000)
            backlog = list(writer.records(eps, n // n_endpoints, seed=seed,
                                          also_deliveries=True))
            cpu0: dict[str, dict[int, float]] = {}
            if not catch_up:
                pids = start()
                cpu0 = {name: tree_cpu(pid) for name, pid in pids.items()}
            if offered is not None:
                return _paced(s, stack.procs["sink"].log_path, writer, backlog, offered,
                              pids, cpu0, db, ep_ids, since_ms)
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
            wait_for(lambda: http_json(f"{url}/_stats")["count"] >= n, 300, interval=0.05,
                     what=f"{n} deliveries sent")
            sent_s = time.perf_counter() - t0

            # On record: the sink's own count of rows written (its /metrics), so the check
            # adds no PostgreSQL work to the timed window (a count over the run's rows, whose
            # heap pages lie scattered over a large table, took ~1 s of PostgreSQL per check).
            sink_log = stack.procs["sink"].log_path

            wait_for(lambda: _on_record_count(sink_log) >= n, 300, interval=0.2,
                     what=f"{n} deliveries on record")
            elapsed = time.perf_counter() - t0
            share = {name: tree_cpu_since(pid, cpu0[name]) / counted * 1e6
                     for name, pid in pids.items()}
            _check_on_record(s, db, ep_ids, since_ms, n)
        rate = (n - c0) / elapsed
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in sorted(share.items(), key=lambda x: -x[1]))
        say(f"engine end to end{' (catching up)' if catch_up else ''}: {rate:.0f} "
            f"deliveries/s on record in PostgreSQL "
            f"({(n - c0) / sent_s:.0f}/s sent; the last on record {elapsed - sent_s:.2f} s "
            f"after the last sent); CPU µs per delivery by process: {cpu}; "
            f"total {sum(share.values()):.0f} (not counted: the bench producing the "
            f"prepared backlog, {own / n * 1e6:.0f})")
        return {"engine_end_to_end_per_s": rate,
                "engine_sent_per_s": (n - c0) / sent_s,
                "engine_end_to_end_cpu_us_per_delivery": sum(share.values())}
