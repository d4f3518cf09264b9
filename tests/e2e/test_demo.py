"""`postbacks demo` as a newcomer runs it (a subprocess, on the test's own topics), with
small counts; every group's row of its table is checked against PostgreSQL itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from postbacks.db.connect import connect
from postbacks.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

COUNTS = {"count": 30, "apps": 2, "endpoints_per_app": 2, "flaky": 6, "dead": 4,
          "dead_attempts": 3, "cohort": 5, "replay": 5}


def _rows(settings: Settings, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with connect(settings.database_url) as conn:
        return conn.execute(sql, params).fetchall()


def _by_status(settings: Settings, eps: list[str]) -> dict[str, int]:
    return {s: int(n) for s, n in _rows(
        settings, "SELECT status, count(*) FROM deliveries WHERE endpoint_id = ANY(%s)"
        " GROUP BY status", eps)}


def _attempts(settings: Settings, eps: list[str]) -> dict[str, list[tuple[str, str, int]]]:
    """delivery_id -> [(trigger, result, status code)] in attempt order."""
    out: dict[str, list[tuple[str, str, int]]] = {}
    for did, trigger, result, code in _rows(
        settings, "SELECT a.delivery_id, a.trigger, a.result, a.status_code"
        " FROM deliveries d JOIN delivery_attempts a USING (delivery_id)"
        " WHERE d.endpoint_id = ANY(%s) ORDER BY a.delivery_id, a.attempted_at, a.attempt_no",
        eps):
        out.setdefault(did, []).append((trigger, result, code))
    return out


def _kinds(settings: Settings, ids: list[str], kind: str) -> set[str]:
    return {r[0] for r in _rows(settings, "SELECT DISTINCT delivery_id FROM delivery_outcomes"
                                          " WHERE delivery_id = ANY(%s) AND kind = %s",
                                ids, kind)}


def test_demo_shows_every_group_and_its_table_matches_postgres(
    settings: Settings, namespace: str, tmp_path: Path,
) -> None:
    report = tmp_path / "demo.json"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
           "POSTBACKS_DATABASE_URL": settings.database_url,
           "POSTBACKS_TOPIC_PREFIX": settings.topic_prefix}
    args = [a for k, v in COUNTS.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    demo = subprocess.Popen(
        [sys.executable, "-m", "postbacks", "demo", "--no-services", "--namespace", namespace,
         "--report-json", str(report), "--timeout", "180", *args],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = demo.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        demo.terminate()  # the demo stops everything it started on SIGTERM
        out, _ = demo.communicate(timeout=60)
        raise AssertionError(f"the demo ran past 420 s:\n{out[-6000:]}") from None
    assert demo.returncode == 0, out[-6000:]
    assert "result OK" in out and "make services-down" in out
    data = json.loads(report.read_text())
    rows = {r["group"]: r for r in data["rows"]}
    groups = data["groups"]
    assert data["ok"] and set(rows) == {"healthy", "flaky", "dead", "cohort", "replay"}
    for name, r in rows.items():
        assert f"\n{name} " in out, f"no table row for {name}"
        assert r["problems"] == [], (name, r["problems"])

    # healthy: every delivery delivered on its first attempt (replays aside)
    healthy = groups["healthy"]["endpoint_ids"]
    n = COUNTS["count"] * COUNTS["endpoints_per_app"]
    assert _by_status(settings, healthy) == {"delivered": n}
    att = _attempts(settings, healthy)
    firsts = [a for did, a in att.items() if [x for x in a if x[0] != "manual"]
              == [("initial", "delivered", 200)]]
    assert len(att) == len(firsts) == n
    assert (rows["healthy"]["deliveries"], rows["healthy"]["delivered"],
            rows["healthy"]["attempts"], rows["healthy"]["retried"]) == (n, n, n, 0)

    # flaky: a 503, then delivered by the retry
    flaky = groups["flaky"]["endpoint_ids"]
    att = _attempts(settings, flaky)
    assert len(att) == COUNTS["flaky"]
    assert all(a == [("initial", "retryable", 503), ("retry", "delivered", 200)]
               for a in att.values()), att
    assert _by_status(settings, flaky) == {"delivered": COUNTS["flaky"]}
    assert (rows["flaky"]["delivered"], rows["flaky"]["retried"], rows["flaky"]["attempts"]
            ) == (COUNTS["flaky"], COUNTS["flaky"], 2 * COUNTS["flaky"])

    # dead: every attempt a 503, the budget spent, dead-lettered; the breaker quarantined some
    dead = groups["dead"]["endpoint_ids"]
    att = _attempts(settings, dead)
    assert len(att) == COUNTS["dead"]
    assert all(len(a) == COUNTS["dead_attempts"] and {x[2] for x in a} == {503}
               for a in att.values()), att
    assert _by_status(settings, dead) == {"exhausted": COUNTS["dead"]}
    dl = _rows(settings, "SELECT reason, count(*) FROM dead_letters WHERE delivery_id = ANY(%s)"
                         " GROUP BY reason", list(att))
    assert dl == [("exhausted", COUNTS["dead"])]
    quarantined = _kinds(settings, list(att), "quarantined")
    assert len(quarantined) >= 1
    assert (rows["dead"]["dead_lettered"], rows["dead"]["quarantined"],
            rows["dead"]["attempts"]) == (COUNTS["dead"], len(quarantined),
                                          COUNTS["dead"] * COUNTS["dead_attempts"])

    # cohort: held as retrodated, released by the reviewer, then delivered (one attempt)
    cohort = groups["cohort"]["endpoint_ids"]
    att = _attempts(settings, cohort)
    ids = list(att)
    assert len(ids) == COUNTS["cohort"]
    assert all(a == [("release", "delivered", 200)] for a in att.values()), att
    assert _rows(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = ANY(%s)"
                           " AND held_at IS NOT NULL AND hold_reason = 'retrodated'"
                           " AND status = 'delivered'", cohort) == [(COUNTS["cohort"],)]
    released_by = _rows(settings, "SELECT DISTINCT actor FROM delivery_outcomes"
                                  " WHERE delivery_id = ANY(%s) AND kind = 'released'", ids)
    assert released_by == [(f"reviewer:demo-reviewer-{namespace}",)]
    assert _rows(settings, "SELECT count(*) FROM audit_log WHERE action = 'held.release'"
                           " AND target_id = ANY(%s)", ids) == [(COUNTS["cohort"],)]
    assert (rows["cohort"]["held"], rows["cohort"]["released"], rows["cohort"]["delivered"]
            ) == (COUNTS["cohort"],) * 3

    # replay: replayed healthy deliveries sent again with their original idempotency key
    replayed = groups["replay"]["delivery_ids"]
    assert len(replayed) == COUNTS["replay"]
    assert _kinds(settings, replayed, "replayed") == set(replayed)
    again = _rows(settings, "SELECT count(*) FROM delivery_attempts a JOIN deliveries d"
                            " USING (delivery_id) WHERE a.delivery_id = ANY(%s)"
                            " AND a.trigger = 'manual' AND a.result = 'delivered'"
                            " AND a.idempotency_key = d.idempotency_key", replayed)
    assert again == [(COUNTS["replay"],)]
    assert (rows["replay"]["replayed"], rows["replay"]["receiver_unique"]) == (
        COUNTS["replay"], COUNTS["replay"])
