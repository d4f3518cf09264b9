"""`postbacks demo`: the whole pipeline on local services, showing what goes wrong and what
the pipeline does about it, group by group, with live progress and a checked table.

services up -> migrations -> topics -> a signature-verifying receiver -> endpoints in five
groups -> fanout, gate, agent, relay, sink and the console -> conversions for each group:

- **healthy**: delivered on the first attempt;
- **flaky**: the receiver answers 503 to the first attempt of every delivery, then 200:
  retried through the retry topics and the relay, delivered on the second attempt;
- **dead**: the receiver always answers 503: the endpoint's breaker opens, the last
  deliveries are quarantined (no attempt consumed), and after the endpoint's retry budget
  (its ``max_attempts``) every delivery is dead-lettered;
- **cohort**: retrodated conversions (completed 30 days before they were recorded) to an
  endpoint whose retrodating guard is in enforce mode: held by the gate, then released by a
  reviewer through the console's API, then delivered;
- **replay**: delivered healthy postbacks replayed by support through the console's API:
  they arrive again with their original idempotency keys.

The demo's stages run with a shortened schedule (environment of the processes it starts;
the product's defaults are unchanged): see :func:`demo_env`. It ends with a table of counts
read from PostgreSQL and cross-checked against the receiver, where to see each group, and
exits 1 when a group did not show what it should. ``--keep-console`` leaves every process
it started running (Ctrl-C stops them); Kafka and PostgreSQL stay up either way.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from postbacks.core.endpoint import EndpointConfig
from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.db.migrate import migrate
from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.kafka.clients import check_broker
from postbacks.settings import Settings
from postbacks.tools.demo_options import (
    DemoOptions,
    demo_env,
    demo_replication,
    validate,
)
from postbacks.tools.demo_report import (
    Group,
    Row,
    check,
    count_group,
    progress_counts,
    progress_line,
    receiver_view,
    render_table,
    sample_ids,
    where_to_see,
)
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from postbacks.tools.seed import seed_endpoints
from postbacks.tools.services import with_script_addresses
from replay_console.auth import create_token
from topics.admin import create_topics

__all__ = ["DemoOptions", "demo_env", "demo_replication", "run_demo"]

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000
STAGES = ("sink", "relay", "agent", "gate", "fanout")


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _api(base: str, token: str, path: str, payload: Any = None) -> Any:
    """A console API call as the token's holder; a refusal raises with its message."""
    req = urllib.request.Request(
        f"{base}/api/v1{path}", data=None if payload is None else json.dumps(payload).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"console {path}: HTTP {exc.code}: "
                           f"{exc.read().decode(errors='replace')[:300]}") from exc


def _seed_groups(settings: Settings, o: DemoOptions, ns: str, base: str) -> list[Group]:
    now_ms = int(time.time() * 1000)
    kw: dict[str, Any] = {"receiver_url": base, "now_ms": now_ms}
    healthy = seed_endpoints(settings, apps=o.apps, endpoints_per_app=o.endpoints_per_app,
                             namespace=ns, **kw)
    flaky = seed_endpoints(settings, apps=1, endpoints_per_app=1, namespace=f"{ns}_flaky", **kw)
    # concurrency 1: attempts one after the other, so the breaker opens exactly at its
    # threshold and the attempts after it are quarantined
    dead = seed_endpoints(settings, apps=1, endpoints_per_app=1, namespace=f"{ns}_dead",
                          config=EndpointConfig(max_attempts=o.dead_attempts), concurrency=1,
                          **kw)
    cohort = seed_endpoints(settings, apps=1, endpoints_per_app=1, namespace=f"{ns}_cohort",
                            **kw)
    secrets = {s.endpoint_id: [s.secret] for s in (*healthy, *flaky, *dead, *cohort)}
    http_json(f"{base}/_control/secrets", secrets)
    http_json(f"{base}/_control/script", {
        flaky[0].endpoint_id: {"statuses": [503, 200], "per_delivery": True},
        dead[0].endpoint_id: {"statuses": [503]},
    })
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="endpoint", scope_key=cohort[0].endpoint_id,
                 detector="retrodating", mode="enforce", actor="demo",
                 note="postbacks demo: the retrodated cohort")
        conn.commit()

    def group(name: str, seeded: list[Any], expected: int, each: int = 1) -> Group:
        return Group(name, [s.endpoint_id for s in seeded], expected,
                     apps=sorted({s.app_id for s in seeded}), attempts_each=each)

    return [group("healthy", healthy, o.count * o.endpoints_per_app),
            group("flaky", flaky, o.flaky, 2), group("dead", dead, o.dead, o.dead_attempts),
            group("cohort", cohort, o.cohort), Group("replay", [], o.replay)]


def _emit(settings: Settings, o: DemoOptions, ns: str) -> int:
    producer = ConversionProducer(settings)
    now_ms = int(time.time() * 1000)
    seed = int(time.time())
    for name, n in (("flaky", o.flaky), ("dead", o.dead), ("cohort", o.cohort)):
        for ev in synthetic_conversions(n, apps=1, seed=seed, namespace=f"{ns}_{name}",
                                        now_ms=now_ms):
            if name == "cohort":  # recorded now, completed 30 days ago: retrodated
                ev["source_created_at"] = now_ms
                ev["source_completed_at"] = now_ms - 30 * DAY_MS
            producer.send(ev)
    start = time.monotonic()
    for i, ev in enumerate(synthetic_conversions(o.count, apps=o.apps, seed=seed,
                                                 namespace=ns, now_ms=now_ms), 1):
        producer.send(ev)
        if o.rate > 0 and (ahead := i / o.rate - (time.monotonic() - start)) > 0:
            time.sleep(ahead)
    if producer.flush() or producer.failed:
        raise RuntimeError(f"conversions not acknowledged by Kafka: {producer.failed[:3]}")
    return producer.acked


def _replay(settings: Settings, console: str, token: str, g: Group, healthy: Group
            ) -> tuple[str, dict[str, str]]:
    """Replay ``g.expected`` delivered healthy postbacks (spread over the endpoints) as
    support; returns (job id, delivery_id -> idempotency key)."""
    per_ep = math.ceil(g.expected / len(healthy.endpoint_ids))
    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "SELECT delivery_id, idempotency_key FROM (SELECT delivery_id, idempotency_key,"
            " row_number() OVER (PARTITION BY endpoint_id ORDER BY created_at) AS rn"
            " FROM deliveries WHERE endpoint_id = ANY(%s) AND status = 'delivered') x"
            " WHERE rn <= %s ORDER BY rn LIMIT %s",
            (healthy.endpoint_ids, per_ep, g.expected)).fetchall()
    g.delivery_ids = [r[0] for r in rows]
    g.since = time.time()
    job = _api(console, token, "/replays", {"delivery_ids": g.delivery_ids,
                                            "note": "postbacks demo", "confirm": len(rows)})
    return str(job["job_id"]), {r[0]: r[1] for r in rows}


def _report(settings: Settings, base: str, groups: list[Group], keys: dict[str, str]
            ) -> list[Row]:
    received = http_json(f"{base}/_control/received", timeout=60)
    replay = next(x for x in groups if x.name == "replay")
    rows = []
    for g in groups:
        counts = count_group(settings.database_url, g)
        seen = receiver_view(received, g, keys)
        rows.append(Row(g.name, counts, seen, check(g, counts, seen, len(replay.delivery_ids))))
    return rows


def run_demo(settings: Settings, o: DemoOptions) -> int:
    validate(o)
    # SIGTERM stops the demo as Ctrl-C does: through the Stack's exit, so no stage, receiver
    # or console it started is left running against the shared broker.
    signal.signal(signal.SIGTERM, _interrupt)
    t0 = time.monotonic()
    script = ROOT / "deploy" / "local" / "services.sh"
    if o.start_services and script.exists():
        _say("starting Kafka and PostgreSQL (deploy/local/services.sh up)")
        subprocess.run(["bash", str(script), "up"], check=True)
        settings = with_script_addresses(settings, script)  # (its ports may be moved)
    settings = demo_replication(settings)
    check_broker(settings)
    _say(f"migrations: {', '.join(migrate(settings.database_url)) or 'up to date'}")
    _say(f"topics created: {len(create_topics(settings))}")
    ns = o.namespace or f"d{int(time.time())}"
    shortened = demo_env(o, ns)
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "POSTBACKS_DATABASE_URL": settings.database_url,
        "POSTBACKS_KAFKA_REPLICATION": settings.kafka_replication,
        "POSTBACKS_TOPIC_PREFIX": settings.topic_prefix,
        "POSTBACKS_ALLOW_LOOPBACK_TARGETS": "true",
        **shortened,
    }
    _say("shortened for the demo's processes (product defaults unchanged): "
         + ", ".join(f"{k}={v}" for k, v in shortened.items() if "GLOBAL" not in k)
         + f"; the dead endpoint's config: max_attempts {o.dead_attempts} (default 50)")
    # services.sh's state dir: POSTBACKS_STATE_DIR (unset or empty: <repo>/.local), its logs/
    state_dir = Path(os.environ.get("POSTBACKS_STATE_DIR") or ROOT / ".local").absolute()
    log_dir = state_dir / "logs" / f"demo-{ns}"
    rows: list[Row] = []
    with Stack(env, log_dir, tied=True) as stack:
        _, rport = stack.start_listening(
            "receiver", "receiver", "--port", "{port}",
            ready=lambda p: http_json(f"http://127.0.0.1:{p}/_control/stats"))
        base = f"http://127.0.0.1:{rport}"
        groups = _seed_groups(settings, o, ns, base)
        g = {x.name: x for x in groups}
        _say(f"namespace {ns}: {len(g['healthy'].endpoint_ids)} healthy endpoints over"
             f" {o.apps} apps, 1 flaky (503 then 200), 1 dead (always 503), 1 cohort"
             f" (retrodating guard: enforce); receiver on {base}")
        metrics: dict[str, str] = {}
        for stage in STAGES:
            port = free_port()
            metrics[stage] = f"http://127.0.0.1:{port}/metrics"
            stack.start(stage, stage, extra_env={"POSTBACKS_METRICS_PORT": str(port)})
        _, cport = stack.start_listening(
            "console", "console", "serve", "--port", "{port}",
            ready=lambda p: http_json(f"http://127.0.0.1:{p}/healthz"))
        console = f"http://127.0.0.1:{cport}"
        with connect(settings.database_url) as conn:
            _i, support = create_token(conn, name=f"demo-support-{ns}", role="support",
                                       created_by="demo")
            _i, reviewer = create_token(conn, name=f"demo-reviewer-{ns}", role="reviewer",
                                        created_by="demo")
            conn.commit()
        _say(f"stages running: {', '.join(STAGES)}, console on {console} (logs in {log_dir})")
        emitted = _emit(settings, o, ns)
        start = time.monotonic()
        _say(f"emitted {emitted} conversions -> {sum(x.expected for x in groups[:4])}"
             " deliveries expected")
        wait_for(lambda: http_json(f"{console}/healthz"), 60, what="the console")
        timeout = o.timeout_s or 150.0 + g["healthy"].expected / 100
        deadline = start + timeout
        phase = {"replay": "waits for every healthy delivery", "cohort": ""}
        job_id: str | None = None
        keys: dict[str, str] = {}
        released = False
        healthy_s: float | None = None
        last = 0.0
        while True:
            el = time.monotonic() - start
            st = progress_counts(settings.database_url, groups)
            stats = http_json(f"{base}/_control/stats")
            if not released and st["cohort"]["held"] >= g["cohort"].expected:
                g["cohort"].since = time.time()
                released = True
                try:
                    r = _api(console, reviewer, "/held/release", {
                        "endpoint": g["cohort"].endpoint_ids[0],
                        "confirm": g["cohort"].expected,
                        "note": "postbacks demo: checked, release"})
                    phase["cohort"] = f"{len(r['delivery_ids'])} released"
                    _say(f"{el:5.1f}s cohort: {len(r['delivery_ids'])} held deliveries"
                         " released by a reviewer through the console")
                except RuntimeError as exc:
                    phase["cohort"] = "release refused"
                    _say(f"{el:5.1f}s cohort: the release failed: {exc}")
            if healthy_s is None and st["healthy"]["delivered"] >= g["healthy"].expected:
                healthy_s = el
                try:
                    job_id, keys = _replay(settings, console, support, g["replay"],
                                           g["healthy"])
                    phase["replay"] = f"job {job_id}"
                    _say(f"{el:5.1f}s every healthy delivery delivered; support replays"
                         f" {len(keys)} of them through the console (job {job_id})")
                except RuntimeError as exc:
                    phase["replay"] = "refused"
                    _say(f"{el:5.1f}s replay: the console refused it: {exc}")
            if time.monotonic() - last >= 2.0:
                last = time.monotonic()
                _say(progress_line(el, st, g, stats, phase))
            healthy_req = sum(int(stats["per_endpoint"].get(e, 0))
                              for e in g["healthy"].endpoint_ids)
            settled = (healthy_s is not None and released
                       and healthy_req >= g["healthy"].expected + len(keys)
                       and st["healthy"]["delivered"] >= g["healthy"].expected
                       and st["flaky"]["delivered"] >= g["flaky"].expected
                       and st["dead"]["exhausted"] + st["dead"]["dead_lettered"]
                       >= g["dead"].expected
                       and st["cohort"]["delivered"] >= g["cohort"].expected)
            over = time.monotonic() > deadline
            if settled or over:
                rows = _report(settings, base, groups, keys)
                if over or all(not r.problems for r in rows):
                    break
            if stack.dead():
                _say(f"a process stopped: {', '.join(stack.dead())} (see {log_dir})")
                for name in stack.dead():  # what it said last: usually why
                    print(f"--- the end of {name}'s log ---\n{stack.procs[name].tail(30)}")
                rows = _report(settings, base, groups, keys)
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - start
        ok = bool(rows) and all(not r.problems for r in rows)
        print()
        print(f"=== postbacks demo: namespace {ns} ===")
        print(render_table(rows))
        print()
        if healthy_s is not None:
            print(f"healthy: {g['healthy'].expected} deliveries in {healthy_s:.1f}s after the"
                  f" emit ({g['healthy'].expected / max(healthy_s, 1e-9):.0f}/s); every group"
                  f" settled {elapsed:.1f}s after it")
        samples = sample_ids(settings.database_url, groups)
        for line in where_to_see(groups, console, metrics, job_id, samples):
            print(line)
        print(f"total wall time {time.monotonic() - t0:.1f}s; result {'OK' if ok else 'FAIL'}")
        if o.report_json:
            Path(o.report_json).write_text(json.dumps({
                "namespace": ns, "topic_prefix": settings.topic_prefix, "console": console,
                "ok": ok, "rows": [r.to_json() for r in rows],
                "groups": {x.name: {"endpoint_ids": x.endpoint_ids,
                                    "delivery_ids": x.delivery_ids, "expected": x.expected,
                                    "attempts_each": x.attempts_each} for x in groups},
            }, indent=2))
        sys.stdout.flush()
        if o.keep_console:
            _say(f"console: {console}/login  sign in with the reviewer token {reviewer}")
            _say(f"  (support token: {support}); receiver {base}/_control/stats")
            _say(f"every process of the demo keeps running; Ctrl-C (or kill {os.getpid()})"
                 " stops them")
            signal.signal(signal.SIGINT, signal.default_int_handler)  # even in background
            try:
                while not stack.dead():
                    time.sleep(1.0)
                _say(f"a process stopped: {', '.join(stack.dead())}")
            except KeyboardInterrupt:
                pass
    print("Kafka and PostgreSQL are still running: `make services-down` stops them.",
          flush=True)
    return 0 if ok else 1
