"""Part 2 of the replay-console benchmark (``bench/console.py``): first-attempt latency
without and with a bulk replay draining, and the drain rate against its caps."""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.console_list import copy_rows, row, stats
from bench.first_attempts import Stream, per_second, read_topic
from bench.harness import cpu_s, env_for, say
from postbacks.codec import codec_for
from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, upsert_endpoint
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from replay_console import queries as q
from replay_console.auth import Principal
from topics import TOPICS
from topics.admin import create_topics, delete_prefixed_topics


def drain_lock_holder(s: Settings) -> list[Any]:
    """Backends holding this deployment's drain lock: pg_try_advisory_lock(DRAIN_LOCK,
    hashtext(topic prefix)), i.e. classid/objid/objsubid = key1/key2/2."""
    from replay_console.drain import DRAIN_LOCK

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
    from replay_console.drain import Drainer

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


def run_replay(base: Settings, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    from replay_console.actions import create_replay, job_status

    tag = f"r{secrets.token_hex(4)}"
    s = load_settings({}, kafka_bootstrap_servers=base.kafka_bootstrap_servers,
                      database_url=base.database_url,
                      kafka_replication=base.kafka_replication,
                      kafka_replication_factor=base.kafka_replication_factor,
                      kafka_min_insync_replicas=base.kafka_min_insync_replicas,
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
                lines = [row(n, tag, endpoints[n % len(endpoints)][0], app,
                              now_ms - 6 * 3600_000 + n * (6 * 3600_000 // args.replay),
                              "delivered", None, rng) for n in range(args.replay)]
                copy_rows(conn, lines)
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
        # with intents on, every request has two records: its intent and its result
        per_request = 2 if s.attempt_intents else 1
        attempts = read_topic(s, TOPICS.attempts.base,
                              want=out["receiver_stats_total"] * per_request, timeout=120)
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
            if a["result"] == "sending":  # an intent: its result follows
                continue
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
        out["first_attempt_baseline"] = stats(first_base)
        out["first_attempt_during_replay"] = stats(first_during)
        out["first_attempt_after_replay"] = stats(first_after)
        out["replay_publish_to_attempt"] = stats(replay_lat)
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
