"""Part 1 of the replay-console benchmark (``bench/console.py``): the list page's latency
over 1 M deliveries, and the synthetic delivery rows both parts load."""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import random
import secrets
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from bench.harness import cpu_s, env_for, pct, say
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from replay_console import queries as q
from replay_console.auth import Principal, create_token, lookup_token

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


def stats(values: list[float]) -> dict[str, float]:
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


def copy_rows(conn: Any, lines: list[str]) -> None:
    cols = ("delivery_id, endpoint_id, app_id, conversion_id, event_type, goal_id, event_id,"
            " idempotency_key, payout_usd_micros, snapshot, created_at, status, status_at,"
            " attempt_count, last_error, held_at, hold_reason")
    with conn.cursor() as cur, cur.copy(f"COPY deliveries ({cols}) FROM STDIN") as copy:
        for i in range(0, len(lines), 5000):
            copy.write("".join(lines[i:i + 5000]))


def row(n: int, tag: str, ep: str, app: str, created_ms: int, status: str,
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
                    lines.append(row(n, tag, f"ep_{tag}_tiny", f"app_{tag}_tiny", times[n],
                                      st, err, rng))
                    continue
                e = rng.choices(range(n_eps), cum_weights=cum)[0]
                per_ep[e] += 1
                lines.append(row(n, tag, f"ep_{tag}_{e:04d}", f"app_{tag}_{e // per_app:03d}",
                                  times[n], st, err, rng))
            copy_rows(conn, lines)
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
        out["http"] = {f"{name} {path}": stats(v) for (name, path), v in timings.items()}
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
                sql_ms[name] = stats(vals)
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
            st = stats(v)
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
