"""Replay-console benchmark (issue 5's two figures; traffic to 127.0.0.1 only).

1. **List page latency over 1 M deliveries**: ``--rows`` deliveries (default 1,000,000:
   ~2,000 endpoints over ~200 apps with a Zipf-like skew, mostly delivered, some failing /
   dead-lettered / held, ``last_error`` set on failures, ``created_at`` over 30 days in
   insertion order) are COPYed into ``deliveries`` with a unique id prefix, then ANALYZEd.
   A console server (``postbacks console serve --no-drain``) answers sequential GETs
   (round-robin over the cases, after a warm-up) of ``/deliveries`` (HTML) and
   ``/api/v1/deliveries`` (JSON) with a support token and a publisher token: unfiltered
   first page, a page 20 pages deep by cursor, by app, by endpoint, by status, by error
   class, by date range, app + status, and the first page of a publisher of the biggest
   app and of a median-sized app. p50/p95/p99 per case,
   the query's own time in-process, and ``EXPLAIN (ANALYZE, BUFFERS)`` of each case's SQL.
   The rows are deleted at the end (unless ``--keep``).
2. **Bulk replay vs first attempts**: fresh topics (a prefix), a local receiver answering
   200, ``--endpoints`` endpoints, ``relay``, ``agent``, ``sink`` and a console server
   (whose drainer runs at ``--cap`` per endpoint/s and ``--cap-total``/s) are started; first
   attempts are produced straight onto ``dispatch.v1`` at ``--rate``/s. After a baseline of
   ``--seconds``, a bulk replay of ``--replay`` stored deliveries (inserted for those
   endpoints) is queued as an admin; first attempts continue until it has drained. First-
   attempt latency (``attempts.v1`` attempted_at - the record's enqueued_at) p50/p99 without
   vs with the replay draining, and the drain rate achieved (``replay_items.published_at``
   and the retry topic's record timestamps) vs the cap.

Results go to stdout and ``bench/results/console-latest.json``. Usage:
``python bench/console.py [--rows 1000000] [--requests 200] [--replay 10000] [--rate 300]
[--seconds 40] [--cap 5] [--cap-total 100] [--skip-list] [--skip-replay] [--keep]``.
Needs the services and KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import random
import secrets
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import ROOT, cpu_s, env_for, pct, say
from postbacks.codec import codec_for
from postbacks.console import queries as q
from postbacks.console.auth import Principal, create_token, lookup_token
from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, upsert_endpoint
from postbacks.db.migrate import migrate
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from postbacks.topics import TOPICS
from postbacks.topics.admin import create_topics, delete_prefixed_topics
from tests.unit.factories import make_conversion, make_delivery

DAY_MS = 86_400_000
STATUS_MIX = (("delivered", 0.92), ("dead_lettered", 0.02), ("failing", 0.015),
              ("held", 0.01), ("exhausted", 0.005), ("quarantined", 0.005),
              ("replayed", 0.005), ("released", 0.005), ("pending", 0.005),
              ("rejected", 0.005), ("suppressed", 0.005))
FAILED = {"dead_lettered", "failing", "exhausted", "quarantined", "suppressed"}
ERROR_MIX = (("http_500", 0.35), ("timeout", 0.2), ("connection_error", 0.15),
             ("http_503", 0.1), ("http_404", 0.1), ("http_429", 0.05), ("tls_error", 0.05))
HOLD_REASONS = ("value_rate", "retrodating")


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ts(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()


def _stats(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_ms": round(pct(values, 50), 2),
            "p95_ms": round(pct(values, 95), 2), "p99_ms": round(pct(values, 99), 2),
            "max_ms": round(max(values), 2) if values else float("nan")}


def _snapshot(n: int, tag: str, app: str, created_ms: int, rng: random.Random) -> dict[str, Any]:
    """A small, realistic ConversionEvent (what the sink stores in ``deliveries.snapshot``)."""
    return {
        "event_id": f"evt_{tag}_{n}", "conversion_id": f"cv_{tag}_{n}", "app_id": app,
        "event_type": "conversion", "goal_id": None,
        "payout_usd_micros": rng.choice((250_000, 500_000, 1_250_000, 3_000_000)),
        "source_created_at": created_ms - 4000, "source_completed_at": created_ms - 9000,
        "occurred_at": created_ms - 2000,
        "source_snapshot": {"player_id": f"p{rng.randrange(10**7)}",
                            "amount": f"{rng.randrange(1, 5000) / 100:.2f}",
                            "country": rng.choice(("US", "DE", "BR", "IN", "JP")),
                            "offer_id": f"of_{rng.randrange(5000)}"},
        "original_amount": None, "original_currency": None, "producer": "bench-console",
    }


def _copy_rows(conn: Any, lines: list[str]) -> None:
    cols = ("delivery_id, endpoint_id, app_id, conversion_id, event_type, goal_id, event_id,"
            " idempotency_key, payout_usd_micros, snapshot, created_at, status, status_at,"
            " attempt_count, last_error, held_at, hold_reason")
    with conn.cursor() as cur, cur.copy(f"COPY deliveries ({cols}) FROM STDIN") as copy:
        for i in range(0, len(lines), 5000):
            copy.write("".join(lines[i:i + 5000]))


def _row(n: int, tag: str, ep: str, app: str, created_ms: int, status: str,
         error: str | None, rng: random.Random) -> str:
    snap = _snapshot(n, tag, app, created_ms, rng)
    attempts = 0 if status in ("pending", "held", "rejected") else (
        1 if status == "delivered" else rng.randint(2, 9))
    status_at = created_ms + rng.randrange(200, 600_000)
    held = _ts(created_ms + 50) if status in ("held", "released", "rejected") else "\\N"
    reason = rng.choice(HOLD_REASONS) if held != "\\N" else "\\N"
    fields = (f"dlv_{tag}_{n}", ep, app, snap["conversion_id"], "conversion", "\\N",
              snap["event_id"], f"msg_{tag}_{n}", str(snap["payout_usd_micros"]),
              orjson.dumps(snap).decode(), _ts(created_ms), status, _ts(status_at),
              str(attempts), error or "\\N", held, reason)
    return "\t".join(fields) + "\n"


def load_rows(s: Settings, rows: int, tag: str, now_ms: int) -> dict[str, Any]:
    """COPY ``rows`` deliveries (ids ``dlv_<tag>_<n>``) into PostgreSQL; returns the shape."""
    rng = random.Random(5)
    n_eps, per_app = 2000, 10
    weights = [1 / (i + 1) ** 0.6 for i in range(n_eps)]
    cum = [0.0] * n_eps
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        cum[i] = acc
    statuses, s_cum = zip(*STATUS_MIX, strict=True)
    s_cum = tuple(sum(s_cum[: i + 1]) for i in range(len(s_cum)))
    errors, e_cum = zip(*ERROR_MIX, strict=True)
    e_cum = tuple(sum(e_cum[: i + 1]) for i in range(len(e_cum)))
    span = 30 * DAY_MS
    times = sorted(now_ms - rng.randrange(span) for _ in range(rows))  # insertion order
    per_ep: Counter[int] = Counter()
    per_status: Counter[str] = Counter()
    per_error: Counter[str] = Counter()
    tiny, tiny_every = 0, max(8, rows // 20)
    t0 = time.perf_counter()
    chunk = 100_000
    with connect(s.database_url) as conn:
        for start in range(0, rows, chunk):
            lines = []
            for n in range(start, min(rows, start + chunk)):
                st = rng.choices(statuses, cum_weights=s_cum)[0]
                err = rng.choices(errors, cum_weights=e_cum)[0] if st in FAILED else None
                per_status[st] += 1
                if err:
                    per_error[err] += 1
                if n % tiny_every == 7:  # a new publisher: 20 deliveries in 30 days
                    tiny += 1
                    lines.append(_row(n, tag, f"ep_{tag}_tiny", f"app_{tag}_tiny", times[n],
                                      st, err, rng))
                    continue
                e = rng.choices(range(n_eps), cum_weights=cum)[0]
                per_ep[e] += 1
                lines.append(_row(n, tag, f"ep_{tag}_{e:04d}", f"app_{tag}_{e // per_app:03d}",
                                  times[n], st, err, rng))
            _copy_rows(conn, lines)
            conn.commit()
            done = min(rows, start + chunk)
            el = time.perf_counter() - t0
            say(f"  loaded {done:,} rows in {el:.0f} s ({done / el:,.0f} rows/s)")
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        conn.execute("ANALYZE deliveries")
        conn.commit()
        analyze_s = time.perf_counter() - t1
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('deliveries')),"
                            " (SELECT count(*) FROM deliveries)").fetchone()
    per_app_n: Counter[int] = Counter()
    for e, c in per_ep.items():
        per_app_n[e // per_app] += c
    apps_sorted = sorted(per_app_n.items(), key=lambda x: -x[1])
    eps_sorted = sorted(per_ep.items(), key=lambda x: -x[1])
    return {
        "rows": rows, "load_s": round(load_s, 1), "rows_per_s": round(rows / load_s),
        "analyze_s": round(analyze_s, 1), "table_size_after": size[0] if size else None,
        "table_rows_after": size[1] if size else None, "endpoints": len(per_ep),
        "apps": len(per_app_n), "by_status": dict(per_status.most_common()),
        "by_error": dict(per_error.most_common()),
        "biggest_app": (f"app_{tag}_{apps_sorted[0][0]:03d}", apps_sorted[0][1]),
        "median_app": (f"app_{tag}_{apps_sorted[len(apps_sorted) // 2][0]:03d}",
                       apps_sorted[len(apps_sorted) // 2][1]),
        "tiny_app": (f"app_{tag}_tiny", tiny),
        "median_endpoint": (f"ep_{tag}_{eps_sorted[len(eps_sorted) // 2][0]:04d}",
                            eps_sorted[len(eps_sorted) // 2][1]),
    }


def delete_rows(s: Settings, tag: str) -> float:
    t0 = time.perf_counter()
    with connect(s.database_url, autocommit=True) as conn:
        n = conn.execute("DELETE FROM deliveries WHERE delivery_id LIKE %s",
                         (f"dlv_{tag}_%",)).rowcount
        say(f"  deleted {n:,} rows in {time.perf_counter() - t0:.0f} s; VACUUM ANALYZE ...")
        conn.execute("VACUUM (ANALYZE) deliveries")
    return time.perf_counter() - t0


class Http:
    """A keep-alive HTTP/1.1 client timing whole responses."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def get(self, path: str, token: str) -> tuple[float, int, bytes]:
        t0 = time.perf_counter()
        try:
            self.conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
            r = self.conn.getresponse()
            body = r.read()
        except (http.client.HTTPException, OSError):
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            raise
        return (time.perf_counter() - t0) * 1000, r.status, body


def explain(conn: Any, p: Principal, flt: q.DeliveryFilter) -> str:
    """The list query exactly as ``list_deliveries`` builds it, EXPLAIN ANALYZEd."""
    where, args = q.filter_sql(p, flt)
    hold = "NULL" if p.is_publisher else "d.hold_reason"
    sql = (f"SELECT {q._LIST_COLUMNS}, {hold} FROM deliveries d WHERE {where}"
           " ORDER BY d.created_at DESC, d.delivery_id DESC LIMIT %s")
    import psycopg

    with psycopg.ClientCursor(conn) as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, (*args, flt.limit + 1))
        return "\n".join(r[0] for r in cur.fetchall())


def plan_summary(plan: str) -> dict[str, Any]:
    import re

    idx = sorted(set(re.findall(r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)"
                                r"(?: Backward)? (?:using|on) (\w+)", plan)))
    m = re.search(r"Execution Time: ([\d.]+) ms", plan)
    rows_removed = sum(int(x) for x in re.findall(r"Rows Removed by Filter: (\d+)", plan))
    hits = sum(int(x) for x in re.findall(r"shared hit=(\d+)", plan.split("\n")[0]))
    reads = sum(int(x) for x in re.findall(r"read=(\d+)", plan.split("\n")[0]))
    return {"indexes": idx, "seq_scan": "Seq Scan" in plan,
            "sort": bool(re.search(r"\bSort\b", plan)),
            "execution_ms": float(m.group(1)) if m else None,
            "rows_removed_by_filter": rows_removed, "top_shared_hit": hits,
            "top_read": reads}


def run_list(base: Settings, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    tag = f"b{secrets.token_hex(4)}"
    now_ms = int(time.time() * 1000)
    say(f"list: loading {args.rows:,} deliveries (ids dlv_{tag}_<n>) with COPY ...")
    out: dict[str, Any] = {"tag": tag}
    token_ids: list[str] = []
    try:
        out["load"] = shape = load_rows(base, args.rows, tag, now_ms)
        say(f"  load {shape['load_s']} s ({shape['rows_per_s']:,} rows/s), ANALYZE "
            f"{shape['analyze_s']} s; table now {shape['table_rows_after']:,} rows, "
            f"{shape['table_size_after']}")
        big_app = shape["biggest_app"][0]
        with connect(base.database_url) as conn:
            sid, support = create_token(conn, name=f"bench-{tag}-support", role="support",
                                        created_by="bench/console.py")
            pid, publisher = create_token(conn, name=f"bench-{tag}-publisher", role="publisher",
                                          app_ids=[big_app], created_by="bench/console.py")
            qid, small = create_token(conn, name=f"bench-{tag}-publisher-small",
                                      role="publisher", app_ids=[shape["median_app"][0]],
                                      created_by="bench/console.py")
            conn.commit()
            token_ids += [sid, pid, qid]
            sp, pp = lookup_token(conn, support), lookup_token(conn, publisher)
            tid, tiny = create_token(conn, name=f"bench-{tag}-publisher-tiny",
                                     role="publisher", app_ids=[shape["tiny_app"][0]],
                                     created_by="bench/console.py")
            conn.commit()
            token_ids.append(tid)
            qp, tp = lookup_token(conn, small), lookup_token(conn, tiny)
        assert sp is not None and pp is not None and qp is not None and tp is not None
        port = free_port()
        with Stack(env_for(base), log_dir) as stack:
            srv = stack.start("console-list", "console", "serve", "--port", str(port),
                              "--no-drain")
            wait_for(lambda: http_json(f"http://127.0.0.1:{port}/healthz"), 60,
                     what="console server")
            client = Http(port)
            # a cursor 20 pages deep (default page of 50), as a person clicking "next" gets it
            cursor = None
            for _ in range(20):
                _ms, status, body = client.get(
                    "/api/v1/deliveries" + (f"?cursor={cursor}" if cursor else ""), support)
                assert status == 200, body[:300]
                cursor = orjson.loads(body)["next_cursor"]
            since, until = now_ms - 10 * DAY_MS, now_ms - 9 * DAY_MS
            cases: dict[str, tuple[dict[str, str], str, Principal]] = {
                "first_page": ({}, support, sp),
                "deep_page_21": ({"cursor": cursor}, support, sp),
                "by_app": ({"app": shape["median_app"][0]}, support, sp),
                "by_endpoint": ({"endpoint": shape["median_endpoint"][0]}, support, sp),
                "by_status_dead_lettered": ({"status": "dead_lettered"}, support, sp),
                "by_error_timeout": ({"error": "timeout"}, support, sp),
                "by_date_range_1d": ({"since": _iso(since), "until": _iso(until)}, support, sp),
                "by_app_and_status": ({"app": shape["median_app"][0],
                                       "status": "dead_lettered"}, support, sp),
                "publisher_first_page": ({}, publisher, pp),
                "publisher_small_app_first_page": ({}, small, qp),
                "publisher_tiny_app_first_page": ({}, tiny, tp),
            }
            out["cases"] = {k: v[0] for k, v in cases.items()}
            out["publisher_app"] = shape["biggest_app"]
            out["publisher_small_app"] = shape["median_app"]
            out["publisher_tiny_app"] = shape["tiny_app"]
            paths = ("/deliveries", "/api/v1/deliveries")
            timings: dict[tuple[str, str], list[float]] = {}
            first_rows: dict[str, int] = {}
            errors: list[str] = []
            say(f"  console on :{port}; warm-up, then {args.requests} sequential GETs per "
                f"case and page ({len(cases)} cases x {len(paths)} pages, round-robin) ...")
            for rnd in range(args.requests + 5):
                for name, (params, token, _p) in cases.items():
                    for path in paths:
                        if sum(timings.get((name, path), [])) > args.case_budget_s * 1000:
                            continue  # a slow case: enough samples within its time budget
                        url = path + ("?" + urlencode(params) if params else "")
                        try:
                            ms, status, body = client.get(url, token)
                        except (http.client.HTTPException, OSError) as exc:
                            errors.append(f"{name} {path}: {exc!r}")
                            continue
                        if status != 200:
                            if len(errors) < 20:
                                errors.append(f"{name} {path}: HTTP {status} "
                                              f"{body[:300]!r}")
                            continue
                        if path.startswith("/api") and name not in first_rows:
                            first_rows[name] = len(orjson.loads(body)["deliveries"])
                        if rnd >= 5:  # warm-up
                            timings.setdefault((name, path), []).append(ms)
                if rnd and rnd % 50 == 0:
                    say(f"    round {rnd}/{args.requests + 5}")
            srv_cpu = cpu_s(srv.pid)
        out["http"] = {f"{name} {path}": _stats(v) for (name, path), v in timings.items()}
        out["rows_on_page"] = first_rows
        out["errors"] = errors
        out["console_cpu_s"] = round(srv_cpu, 1)
        # the query alone (in-process, same code as the server) and its plan
        sql_ms: dict[str, dict[str, float]] = {}
        plans: dict[str, str] = {}
        with connect(base.database_url) as conn:
            for name, (params, _token, p) in cases.items():
                flt = q.parse_filter(params)
                vals = []
                for i in range(35):
                    t0 = time.perf_counter()
                    q.list_deliveries(conn, p, flt)
                    if i >= 5:
                        vals.append((time.perf_counter() - t0) * 1000)
                conn.commit()
                sql_ms[name] = _stats(vals)
                plans[name] = explain(conn, p, flt)
                conn.rollback()
        out["query_in_process"] = sql_ms
        out["plans"] = {k: {"summary": plan_summary(v), "text": v} for k, v in plans.items()}
        api = {k.split(" ")[0]: v for k, v in out["http"].items() if "/api/" in k}
        slowest = max(api, key=lambda k: api[k]["p95_ms"]) if api else None
        out["slowest_case"] = slowest
        print()
        print(f"{'case':28} {'page':20} {'p50':>8} {'p95':>8} {'p99':>8}  {'query p95':>9}  "
              "index")
        for (name, path), v in sorted(timings.items(), key=lambda x: (list(cases).index(
                x[0][0]), x[0][1])):
            st = _stats(v)
            summ = plan_summary(plans[name])
            print(f"{name:28} {path:20} {st['p50_ms']:8.1f} {st['p95_ms']:8.1f} "
                  f"{st['p99_ms']:8.1f}  {sql_ms[name]['p95_ms']:9.1f}  "
                  f"{','.join(summ['indexes']) or 'NONE'}{' +Sort' if summ['sort'] else ''}")
        if slowest:
            print(f"\nslowest case by API p95: {slowest}\n{plans[slowest]}\n")
        for e in errors[:10]:
            say(f"  ERROR {e}")
    finally:
        with connect(base.database_url) as conn:
            if token_ids:
                conn.execute("DELETE FROM console_tokens WHERE token_id = ANY(%s)", (token_ids,))
                conn.commit()
        if args.keep:
            say(f"list: --keep: the rows stay (DELETE FROM deliveries WHERE delivery_id "
                f"LIKE 'dlv_{tag}_%')")
        else:
            say(f"list: deleting the {args.rows:,} rows ...")
            out["delete_s"] = round(delete_rows(base, tag), 1)
            say(f"  deleted and vacuumed in {out['delete_s']} s")
    return out


# --- 2. bulk replay vs first attempts ---------------------------------------------------

class Stream(threading.Thread):
    """First attempts straight onto dispatch.v1 at a steady rate, enqueued_at = now."""

    def __init__(self, s: Settings, endpoints: list[tuple[str, str]], rate: float,
                 tag: str) -> None:
        super().__init__(name="first-attempts", daemon=True)
        self.s, self.endpoints, self.rate, self.tag = s, endpoints, rate, tag
        self.stop = threading.Event()
        self.enqueued: dict[str, int] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        codec = codec_for("Delivery")
        p = Producer({"bootstrap.servers": self.s.kafka_bootstrap_servers, "linger.ms": 2,
                      "acks": "all"})
        topic = self.s.topic(TOPICS.dispatch.base)
        p.list_topics(topic, timeout=10)
        start = time.monotonic()
        i = 0
        while not self.stop.is_set():
            ep, app = self.endpoints[i % len(self.endpoints)]
            now = int(time.time() * 1000)
            did = f"dlv_{self.tag}_f{i}"
            conv = make_conversion(event_id=f"evt_{self.tag}_f{i}",
                                   conversion_id=f"cv_{self.tag}_f{i}", app_id=app,
                                   occurred_at=now - 2000, source_created_at=now - 4000,
                                   source_completed_at=now - 9000)
            d = make_delivery(delivery_id=did, endpoint_id=ep, conversion=conv,
                              idempotency_key=f"msg_{self.tag}_f{i}", created_at=now,
                              enqueued_at=now)
            while True:
                try:
                    p.produce(topic, codec.encode(d), ep.encode())
                    break
                except BufferError:
                    p.poll(0.01)
            self.enqueued[did] = now
            i += 1
            ahead = i / self.rate - (time.monotonic() - start)
            p.poll(0)
            if ahead > 0:
                time.sleep(ahead)
        assert p.flush(60) == 0


def read_topic(s: Settings, base_topic: str, *, want: int, idle_s: float = 20.0,
               timeout: float = 120.0) -> list[tuple[int, bytes | None, bytes]]:
    """(timestamp ms, key, value) of every record of a topic (from the start)."""
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap_servers,
                  "group.id": f"bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    topic = s.topic(base_topic)
    md = c.list_topics(topic, timeout=10).topics[topic]
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out: list[tuple[int, bytes | None, bytes]] = []
    deadline = time.monotonic() + timeout
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            msgs = c.consume(2000, timeout=0.5)
            for m in msgs:
                if m.error() is None:
                    out.append((m.timestamp()[1], m.key(), m.value()))
            idle = time.monotonic() - last
            if msgs:
                last = time.monotonic()
            elif (len(out) >= want and idle > 1.0) or idle > idle_s:
                break
    finally:
        c.close()
    return out


def drain_lock_holder(s: Settings) -> list[Any]:
    """Backends holding this deployment's drain lock: pg_try_advisory_lock(DRAIN_LOCK,
    hashtext(topic prefix)), i.e. classid/objid/objsubid = key1/key2/2."""
    from postbacks.console.drain import DRAIN_LOCK

    with connect(s.database_url) as conn:
        return conn.execute(
            "SELECT l.pid, a.backend_start::text FROM pg_locks l JOIN pg_stat_activity a"
            " USING (pid) WHERE l.locktype = 'advisory' AND l.objsubid = 2"
            " AND l.classid::bigint = %s"
            " AND l.objid::bigint = (hashtext(%s)::bigint + 4294967296) %% 4294967296"
            " AND l.granted", (DRAIN_LOCK, s.topic_prefix)).fetchall()


class _Explained(Exception):
    pass


def explain_tick(s: Settings) -> dict[str, Any]:
    """The drainer's own SELECT (whatever ``Drainer.tick`` sends now), EXPLAIN ANALYZEd
    and timed on the live queue; nothing is published or marked (the tick is aborted)."""
    from postbacks.console.drain import Drainer

    captured: dict[str, Any] = {}

    class Spy:
        def __init__(self, conn: Any) -> None:
            self.conn = conn

        def execute(self, sql: str, params: Any = None) -> Any:
            if sql.lstrip().upper().startswith("SELECT") and "replay_items" in sql:
                plan = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params).fetchall()
                runs = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    n = len(self.conn.execute(sql, params).fetchall())
                    runs.append((time.perf_counter() - t0) * 1000)
                captured.update(plan="\n".join(r[0] for r in plan), rows=n,
                                query_ms=[round(x, 1) for x in runs])
                raise _Explained
            return self.conn.execute(sql, params)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

    class NoPublish:
        def publish(self, _items: Any) -> None:
            raise _Explained

    with connect(s.database_url) as conn:
        try:
            Drainer(s, publisher=NoPublish()).tick(Spy(conn))  # type: ignore[arg-type]
        except _Explained:
            pass
        finally:
            conn.rollback()
        captured["pending"] = conn.execute(
            "SELECT count(*) FROM replay_items i JOIN replay_jobs j USING (job_id)"
            " WHERE i.published_at IS NULL AND j.state = 'queued' AND j.topic_prefix = %s",
            (s.topic_prefix,)).fetchone()[0]
    return captured


def _proc_cpu(pid: int | None) -> float | None:
    try:
        return cpu_s(pid) if pid else None
    except OSError:
        return None


def per_second(times_ms: list[int]) -> list[int]:
    if not times_ms:
        return []
    t0 = min(times_ms) // 1000
    c = Counter(t // 1000 - t0 for t in times_ms)
    return [c.get(i, 0) for i in range(max(c) + 1)]


def run_replay(base: Settings, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    from postbacks.console.actions import create_replay, job_status

    tag = f"r{secrets.token_hex(4)}"
    s = load_settings({}, kafka_bootstrap_servers=base.kafka_bootstrap_servers,
                      database_url=base.database_url,
                      topic_prefix=f"bench{int(time.time())}console.",
                      instance_id=f"bench-console-{tag}",
                      console_replay_rate_per_endpoint=args.cap,
                      console_replay_rate_total=args.cap_total)
    say(f"replay: topics {s.topic_prefix}*, ids dlv_{tag}_*, cap {args.cap}/s per endpoint, "
        f"{args.cap_total}/s in all")
    create_topics(s)
    out: dict[str, Any] = {"tag": tag, "topic_prefix": s.topic_prefix,
                           "cap_per_endpoint_per_s": args.cap, "cap_total_per_s": args.cap_total,
                           "first_attempt_rate_per_s": args.rate, "endpoints": args.endpoints,
                           "replay_total": args.replay, "baseline_s": args.seconds}
    holders = drain_lock_holder(s)
    if holders:
        say(f"  WARNING: another replay drainer holds the drain lock: {holders}; this run's "
            "drainer waits for it (and that one would publish this job to ITS topics)")
    out["drain_lock_held_by_other_before"] = [list(map(str, h)) for h in holders]
    app = f"app_{tag}"
    endpoints = [(f"ep_{tag}_{i:02d}", app) for i in range(args.endpoints)]
    job_id: str | None = None
    try:
        port = free_port()
        env = env_for(s, POSTBACKS_CONSOLE_REPLAY_RATE_PER_ENDPOINT=str(args.cap),
                      POSTBACKS_CONSOLE_REPLAY_RATE_TOTAL=str(args.cap_total))
        with Stack(env, log_dir) as stack:
            stack.start("receiver", "receiver", "--port", str(port))
            rx = f"http://127.0.0.1:{port}"
            wait_for(lambda: http_json(f"{rx}/_control/stats"), 30, what="receiver")
            box = SecretBox(s.secrets_key.reveal())
            now_ms = int(time.time() * 1000)
            rng = random.Random(7)
            with connect(s.database_url) as conn:
                for ep, a in endpoints:
                    upsert_endpoint(conn, endpoint_id=ep, app_id=a, url=f"{rx}/hooks/{ep}")
                    add_secret(conn, box, ep, generate_secret(), now_ms=now_ms)
                # the stored deliveries to replay: delivered, created over the last 6 hours
                lines = [_row(n, tag, endpoints[n % len(endpoints)][0], app,
                              now_ms - 6 * 3600_000 + n * (6 * 3600_000 // args.replay),
                              "delivered", None, rng) for n in range(args.replay)]
                _copy_rows(conn, lines)
                conn.commit()
            say(f"  {len(endpoints)} endpoints, {args.replay:,} stored deliveries inserted")
            for stage in ("sink", "relay", "agent"):
                stack.start(stage, stage)
            console_port = free_port()
            stack.start("console-drain", "console", "serve", "--port", str(console_port))
            wait_for(lambda: http_json(f"http://127.0.0.1:{console_port}/healthz"), 60,
                     what="console server")
            stream = Stream(s, endpoints, args.rate, tag)
            stream.start()
            wait_for(lambda: http_json(f"{rx}/_control/stats")["received"] > 0, 90, interval=0.1,
                     what="the first delivery at the receiver")
            t_base0 = int(time.time() * 1000) + int(args.warmup * 1000)
            say(f"  first attempts at {args.rate}/s flowing; warm-up {args.warmup} s, "
                f"baseline {args.seconds} s ...")
            time.sleep(args.warmup + args.seconds)
            t_base1 = int(time.time() * 1000)
            admin = Principal("bench", f"bench-console-{tag}", "admin", ())
            with connect(s.database_url) as conn:
                t0 = time.perf_counter()
                job = create_replay(conn, s, admin, flt=q.DeliveryFilter(app=app),
                                    confirm=args.replay, note="bench/console.py")
                conn.commit()
                out["create_replay_ms"] = round((time.perf_counter() - t0) * 1000)
            job_id = job.job_id
            say(f"  queued {job.job_id}: {job.total:,} deliveries (skipped {job.skipped}) in "
                f"{out['create_replay_ms']} ms; draining ...")
            holders = drain_lock_holder(s)
            backend = int(holders[0][0]) if holders else None
            cpu0 = _proc_cpu(backend)
            w0 = time.monotonic()
            explained = False
            expect_s = args.replay / min(args.cap * len(endpoints), args.cap_total)
            deadline = time.monotonic() + 3 * expect_s + 60
            status: dict[str, Any] = {}
            last_print = 0.0
            while time.monotonic() < deadline:
                if stream.error:
                    raise stream.error
                with connect(s.database_url) as conn:
                    status = job_status(conn, job_id)
                if status["state"] == "done":
                    break
                if not explained and status["published"] >= status["total"] // 3:
                    explained = True
                    try:
                        out["drainer_query"] = ex = explain_tick(s)
                        say(f"    drainer's SELECT with {ex.get('pending')} pending: "
                            f"{ex.get('query_ms')} ms, {ex.get('rows')} rows")
                    except Exception as exc:  # report, keep measuring
                        out["drainer_query"] = {"error": repr(exc)}
                if time.monotonic() - last_print > 10:
                    say(f"    published {status['published']:,}/{status['total']:,}")
                    last_print = time.monotonic()
                time.sleep(1)
            out["job"] = status
            cpu1 = _proc_cpu(backend)
            if cpu0 is not None and cpu1 is not None:
                out["drainer_pg_backend_cpu_s"] = round(cpu1 - cpu0, 1)
                out["drainer_pg_backend_core_share"] = round(
                    (cpu1 - cpu0) / (time.monotonic() - w0), 2)
                say(f"  the drainer's PostgreSQL backend (pid {backend}) used "
                    f"{cpu1 - cpu0:.1f} s CPU during the drain "
                    f"({out['drainer_pg_backend_core_share']:.0%} of a core)")
            time.sleep(5)
            stream.stop.set()
            stream.join(90)
            produced = len(stream.enqueued)
            say(f"  job {status.get('state')}; stream stopped after {produced:,} first "
                "attempts; waiting for the agent to catch up ...")
            want = produced + args.replay
            try:
                wait_for(lambda: http_json(f"{rx}/_control/stats")["received"] >= want, 120,
                         interval=1, what=f"{want} requests at the receiver")
            except TimeoutError as exc:
                say(f"  {exc}")
            out["receiver_stats_total"] = http_json(f"{rx}/_control/stats")["received"]
            out["dead_stages"] = stack.dead()
            for name, proc in stack.procs.items():
                out.setdefault("cpu_s", {})[name] = round(cpu_s(proc.pid), 1)
            tails = {name: proc.tail(15) for name, proc in stack.procs.items()
                     if "Traceback" in proc.tail(200) or "ERROR" in proc.tail(200)}
            out["log_tails_with_errors"] = tails
        # --- measurements (stack stopped) ---
        with connect(s.database_url) as conn:
            pub = conn.execute(
                "SELECT (extract(epoch FROM published_at) * 1000)::bigint, endpoint_id, error"
                " FROM replay_items WHERE job_id = %s AND published_at IS NOT NULL",
                (job_id,)).fetchall()
            out["replay_item_errors"] = dict(Counter(r[2] for r in pub if r[2]))
        pub_ms = sorted(r[0] for r in pub)
        t_rep0, t_rep1 = (pub_ms[0], pub_ms[-1]) if pub_ms else (t_base1, t_base1)
        secs = per_second(pub_ms)
        ep_secs = Counter((r[1], r[0] // 1000) for r in pub)
        out["drain"] = {
            "published": len(pub_ms), "span_s": round((t_rep1 - t_rep0) / 1000, 1),
            "rate_per_s": round(len(pub_ms) / max(0.001, (t_rep1 - t_rep0) / 1000), 1),
            "per_second_median": statistics.median(secs) if secs else None,
            "per_second_max": max(secs) if secs else None,
            "per_endpoint_per_second_max": max(ep_secs.values()) if ep_secs else None,
            "per_second_series": secs,
            "queued_to_first_publish_s": round((t_rep0 - t_base1) / 1000, 2),
        }
        retry = read_topic(s, TOPICS.retry_tier("5s").base, want=len(pub_ms), timeout=60)
        rts = sorted(t for t, _k, _v in retry)
        rsecs = per_second(rts)
        out["drain"]["retry_topic_records"] = len(rts)
        if rts:
            out["drain"]["retry_topic_rate_per_s"] = round(
                len(rts) / max(0.001, (rts[-1] - rts[0]) / 1000), 1)
            out["drain"]["retry_topic_per_second_max"] = max(rsecs)
        attempts = read_topic(s, TOPICS.attempts.base, want=out["receiver_stats_total"],
                              timeout=120)
        acodec = codec_for("Attempt")
        first_base: list[float] = []
        first_during: list[float] = []
        first_after: list[float] = []
        replay_lat: list[float] = []
        pub_at = {}
        with connect(s.database_url) as conn:
            pub_at = dict(conn.execute(
                "SELECT delivery_id, (extract(epoch FROM published_at) * 1000)::bigint"
                " FROM replay_items WHERE job_id = %s", (job_id,)).fetchall())
        triggers: Counter[str] = Counter()
        for _t, _k, v in attempts:
            a = acodec.decode(v)
            triggers[a["trigger"]] += 1
            if a["trigger"] == "initial":
                enq = stream.enqueued.get(a["delivery_id"])
                if enq is None:
                    continue
                lat = a["attempted_at"] - enq
                if t_base0 <= enq < t_base1:
                    first_base.append(lat)
                elif t_rep0 <= enq <= t_rep1:
                    first_during.append(lat)
                elif enq > t_rep1:
                    first_after.append(lat)
            elif a["trigger"] == "manual" and a["delivery_id"] in pub_at:
                replay_lat.append(a["attempted_at"] - pub_at[a["delivery_id"]])
        out["attempts_by_trigger"] = dict(triggers)
        out["first_attempts_produced"] = len(stream.enqueued)
        out["first_attempt_baseline"] = _stats(first_base)
        out["first_attempt_during_replay"] = _stats(first_during)
        out["first_attempt_after_replay"] = _stats(first_after)
        out["replay_publish_to_attempt"] = _stats(replay_lat)
        b99, d99 = out["first_attempt_baseline"]["p99_ms"], out["first_attempt_during_replay"][
            "p99_ms"]
        out["p99_ratio_during_over_baseline"] = round(d99 / b99, 2) if b99 else None
        b50, d50 = out["first_attempt_baseline"]["p50_ms"], out["first_attempt_during_replay"][
            "p50_ms"]
        out["p50_ratio_during_over_baseline"] = round(d50 / b50, 2) if b50 else None
        dr = out["drain"]
        say(f"drain: {dr['published']:,} published over {dr['span_s']} s = {dr['rate_per_s']}/s"
            f" (cap {min(args.cap * len(endpoints), args.cap_total)}/s; per-second median "
            f"{dr['per_second_median']}, max {dr['per_second_max']}; per endpoint max "
            f"{dr['per_endpoint_per_second_max']}/s vs cap {args.cap}); retry topic "
            f"{dr.get('retry_topic_records')} records at {dr.get('retry_topic_rate_per_s')}/s")
        fb, fd = out["first_attempt_baseline"], out["first_attempt_during_replay"]
        say(f"first attempts: baseline p50 {fb['p50_ms']} ms p99 {fb['p99_ms']} ms (n={fb['n']});"
            f" during replay p50 {fd['p50_ms']} ms p99 {fd['p99_ms']} ms (n={fd['n']}); "
            f"p99 ratio {out['p99_ratio_during_over_baseline']}")
        say(f"replays: publish -> attempted p50 "
            f"{out['replay_publish_to_attempt']['p50_ms']} ms, p99 "
            f"{out['replay_publish_to_attempt']['p99_ms']} ms "
            f"(n={out['replay_publish_to_attempt']['n']})")
    finally:
        say("replay: cleaning up rows and topics ...")
        with connect(s.database_url) as conn:
            like = f"dlv_{tag}_%"
            for table in ("delivery_attempts", "delivery_outcomes", "dead_letters",
                          "deliveries"):
                conn.execute(f"DELETE FROM {table} WHERE delivery_id LIKE %s", (like,))
            if job_id:
                conn.execute("DELETE FROM replay_items WHERE job_id = %s", (job_id,))
                conn.execute("DELETE FROM replay_jobs WHERE job_id = %s", (job_id,))
            ids = [e for e, _a in endpoints]
            conn.execute("DELETE FROM endpoint_secrets WHERE endpoint_id = ANY(%s)", (ids,))
            conn.execute("DELETE FROM endpoints WHERE endpoint_id = ANY(%s)", (ids,))
            conn.execute("DELETE FROM sink_offsets WHERE consumer_group LIKE %s",
                         (s.topic_prefix + "%",))
            conn.commit()
        n = delete_prefixed_topics(s, s.topic_prefix)
        say(f"  deleted {n} topics")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="deliveries loaded (list)")
    ap.add_argument("--requests", type=int, default=200,
                    help="timed GETs per case and page (list)")
    ap.add_argument("--replay", type=int, default=10_000, help="deliveries bulk-replayed")
    ap.add_argument("--rate", type=float, default=300.0,
                    help="first attempts produced per second (replay)")
    ap.add_argument("--seconds", type=float, default=40.0,
                    help="baseline window before the replay is queued (replay)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds of first attempts before the baseline window")
    ap.add_argument("--cap", type=float, default=5.0,
                    help="replay cap per endpoint per second (console_replay_rate_per_endpoint)")
    ap.add_argument("--cap-total", type=float, default=100.0,
                    help="replay cap in all per second (console_replay_rate_total)")
    ap.add_argument("--case-budget-s", type=float, default=30.0,
                    help="stop timing a list case (per page) after this many seconds")
    ap.add_argument("--endpoints", type=int, default=20, help="endpoints (replay)")
    ap.add_argument("--skip-list", action="store_true", help="skip the list-latency part")
    ap.add_argument("--skip-replay", action="store_true", help="skip the bulk-replay part")
    ap.add_argument("--keep", action="store_true", help="keep the loaded deliveries (list)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "console-latest.json"))
    args = ap.parse_args()
    base = load_settings(os.environ)
    migrate(base.database_url)
    log_dir = ROOT / ".local" / "bench-logs" / f"console-{int(time.time())}"
    results: dict[str, Any] = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "log_dir": str(log_dir),
        "console_code": {p.name: time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                               time.gmtime(p.stat().st_mtime))
                         for p in sorted((ROOT / "postbacks" / "console").glob("*.py"))},
    }
    t0 = time.perf_counter()
    if not args.skip_list:
        results["list"] = run_list(base, args, log_dir)
    if not args.skip_replay:
        results["replay"] = run_replay(base, args, log_dir)
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["elapsed_s"] = round(time.perf_counter() - t0)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n")
    say(f"results in {args.out} ({results['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
