"""`postbacks demo`: the whole pipeline on local services, with live progress and a summary.

services up -> migrations -> topics -> receiver -> seed endpoints -> fanout, gate, agent,
sink -> emit conversions -> wait until every delivery reached the receiver and PostgreSQL
-> the replay console: a support token, a replay of 100 delivered postbacks through its
API (they arrive again with their original idempotency keys) -> summary -> stop everything
it started (``--keep-console`` leaves the console up until Ctrl-C).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from postbacks.db.connect import connect
from postbacks.db.migrate import migrate
from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.kafka.clients import check_broker
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from topics.admin import create_topics

__all__ = ["run_demo"]

ROOT = Path(__file__).resolve().parents[2]


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _pg_counts(settings: Settings, namespace: str) -> tuple[int, int, int, int]:
    like = f"ep_{namespace}_%"
    with connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM deliveries WHERE endpoint_id LIKE %(l)s),"
            " (SELECT count(*) FROM deliveries WHERE endpoint_id LIKE %(l)s"
            "   AND status = 'delivered'),"
            " (SELECT count(*) FROM delivery_attempts WHERE endpoint_id LIKE %(l)s),"
            " (SELECT count(*) FROM dead_letters WHERE endpoint_id LIKE %(l)s)",
            {"l": like},
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def receiver_with_endpoints(stack: Stack, settings: Settings, namespace: str, *, apps: int,
                            endpoints_per_app: int, port: int | None = None,
                            ) -> tuple[str, list[Any]]:
    """Start the signature-verifying receiver, seed endpoints pointing at it and hand it
    their secrets; returns (its base URL, the seeded endpoints)."""
    port = port or free_port()
    stack.start("receiver", "receiver", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_json(f"{base}/_control/stats"), 30, what="the receiver")
    seeded = seed_endpoints(settings, apps=apps, endpoints_per_app=endpoints_per_app,
                            receiver_url=base, namespace=namespace,
                            now_ms=int(time.time() * 1000))
    http_json(f"{base}/_control/secrets", {s.endpoint_id: [s.secret] for s in seeded})
    return base, list(seeded)


def _console_phase(stack: Stack, settings: Settings, namespace: str, base: str,
                   keep: bool) -> tuple[int, int]:
    """Start the console, replay 100 delivered postbacks through its API; returns (replayed,
    received again with the same idempotency key)."""
    import json
    import urllib.request

    from replay_console.auth import create_token

    port = free_port()
    stack.start("console", "console", "serve", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_json(f"{url}/healthz"), 30, what="the console")
    with connect(settings.database_url) as conn:
        _id, support = create_token(conn, name=f"demo-support-{namespace}", role="support",
                                    created_by="demo")
        _id, admin = create_token(conn, name=f"demo-admin-{namespace}", role="admin",
                                  created_by="demo")
        picked = [r[0] for r in conn.execute(
            "SELECT delivery_id FROM (SELECT delivery_id, row_number() OVER (PARTITION BY"
            " endpoint_id ORDER BY created_at) AS rn FROM deliveries WHERE endpoint_id LIKE %s"
            " AND status = 'delivered') x WHERE rn <= 4 LIMIT 100", (f"ep_{namespace}_%",))]
        conn.commit()
    before = http_json(f"{base}/_control/stats")["received"]
    req = urllib.request.Request(
        f"{url}/api/v1/replays", data=json.dumps({"delivery_ids": picked,
                                                  "note": "demo"}).encode(),
        headers={"Authorization": f"Bearer {admin}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        job = json.loads(resp.read())
    _say(f"console on {url}: replaying {job['total']} delivered postbacks (job {job['job_id']})")
    wait_for(lambda: http_json(f"{base}/_control/stats")["received"] >= before + len(picked),
             60, what="the replayed postbacks")
    got = [r for r in http_json(f"{base}/_control/received")[before:]
           if r["idempotency_key"]]
    with connect(settings.database_url) as conn:
        keys: dict[str, str] = dict(conn.execute(
            "SELECT idempotency_key, delivery_id FROM deliveries WHERE delivery_id = ANY(%s)",
            (picked,)).fetchall())
    same = sum(1 for r in got if r["idempotency_key"] in keys)
    _say(f"replayed postbacks received again: {same}/{len(picked)} with their original "
         "idempotency keys")
    if keep:
        _say(f"console: {url}/  sign in with support token {support}  (admin: {admin})")
        _say("Ctrl-C to stop the console and everything else")
        try:
            while not stack.dead():
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    return len(picked), same


def run_demo(
    settings: Settings, *, count: int, apps: int, endpoints_per_app: int, rate: float,
    keep_console: bool = False,
) -> int:
    t0 = time.monotonic()
    script = ROOT / "deploy" / "local" / "services.sh"
    if script.exists():
        _say("starting Kafka and PostgreSQL (deploy/local/services.sh up)")
        subprocess.run(["bash", str(script), "up"], check=True)
    check_broker(settings)
    _say(f"migrations: {', '.join(migrate(settings.database_url)) or 'up to date'}")
    _say(f"topics created: {len(create_topics(settings))}")
    namespace = f"d{int(time.time())}"
    port = free_port()
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "POSTBACKS_DATABASE_URL": settings.database_url,
        "POSTBACKS_TOPIC_PREFIX": settings.topic_prefix,
        "POSTBACKS_ALLOW_LOOPBACK_TARGETS": "true",
    }
    log_dir = ROOT / ".local" / "logs" / f"demo-{namespace}"
    with Stack(env, log_dir) as stack:
        base, seeded = receiver_with_endpoints(stack, settings, namespace, apps=apps,
                                               endpoints_per_app=endpoints_per_app, port=port)
        _say(f"seeded {len(seeded)} endpoints over {apps} apps; receiver on {base}")
        for stage in ("sink", "relay", "agent", "gate", "fanout"):
            stack.start(stage, stage, extra_env={"POSTBACKS_METRICS_PORT": str(free_port())})
        _say(f"stages running: fanout, gate, agent, relay, sink (logs in {log_dir})")
        expected = count * endpoints_per_app
        producer = ConversionProducer(settings)
        start = time.monotonic()
        for i, ev in enumerate(synthetic_conversions(
            count, apps=apps, seed=int(time.time()), namespace=namespace,
            now_ms=int(time.time() * 1000),
        ), 1):
            producer.send(ev)
            if rate > 0 and (ahead := i / rate - (time.monotonic() - start)) > 0:
                time.sleep(ahead)
        producer.flush()
        _say(f"emitted {producer.acked} conversions -> {expected} deliveries expected")
        last_print = 0.0
        deadline = time.monotonic() + max(120.0, expected / 200)
        rows = (0, 0, 0, 0)
        stats: dict[str, int] = {"unique_ids": 0, "bad_signatures": 0}
        while time.monotonic() < deadline:
            stats = http_json(f"{base}/_control/stats")
            rows = _pg_counts(settings, namespace)
            if time.monotonic() - last_print >= 1.0:
                last_print = time.monotonic()
                el = time.monotonic() - start
                _say(f"{el:5.1f}s received {stats['unique_ids']:>7}/{expected}"
                     f"  ({stats['unique_ids'] / el:6.0f}/s)  rows: deliveries {rows[0]},"
                     f" delivered {rows[1]}, attempts {rows[2]}")
            if stats["unique_ids"] >= expected and rows[1] >= expected:
                break
            if stack.dead():
                _say(f"a stage died: {stack.dead()}")
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - start
        replayed = same_key = 0
        if stats["unique_ids"] >= expected and rows[1] >= expected:
            replayed, same_key = _console_phase(stack, settings, namespace, base, keep_console)
    ok = (stats["unique_ids"] >= expected and rows[1] >= expected
          and stats["bad_signatures"] == 0 and replayed > 0 and same_key == replayed)
    print()
    print("=== postbacks demo summary ===")
    print(f"conversions emitted        {producer.acked}")
    print(f"deliveries expected        {expected}")
    print(f"delivered (unique ids)     {stats['unique_ids']}  "
          f"(bad signatures: {stats['bad_signatures']})")
    print(f"deliveries rows            {rows[0]}  (status delivered: {rows[1]})")
    print(f"attempt rows               {rows[2]}")
    print(f"dead letters               {rows[3]}")
    print(f"end-to-end throughput      {stats['unique_ids'] / max(elapsed, 1e-9):.0f} deliveries/s"
          f" over {elapsed:.1f}s")
    print(f"console replays            {same_key}/{replayed} received again, original keys")
    print(f"total wall time            {time.monotonic() - t0:.1f}s")
    print(f"result                     {'OK' if ok else 'INCOMPLETE'}")
    sys.stdout.flush()
    return 0 if ok else 1
