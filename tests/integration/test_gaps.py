"""The gap detector against the real PostgreSQL: which deliveries are gaps, the summary the
monitor exports, and ``postbacks gaps``."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from postbacks.db.connect import connect
from postbacks.db.gaps import gap_summary, list_gaps
from postbacks.settings import Settings

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(autouse=True)
def _remove_rows(settings: Settings, namespace: str) -> Iterator[None]:
    """The shared database keeps no gap or held row of these tests (later tests count
    gaps and held deliveries database-wide)."""
    yield
    with connect(settings.database_url) as conn:
        conn.execute("DELETE FROM deliveries WHERE endpoint_id LIKE %s", (f"ep_{namespace}_%",))
        conn.commit()


def _delivery(conn: object, endpoint: str, n: int, status: str, *, created_ago_s: float,
              quiet_ago_s: float | None) -> str:
    delivery_id = f"dlv_{endpoint}_{n}"
    created = NOW - dt.timedelta(seconds=created_ago_s)
    status_at = None if quiet_ago_s is None else NOW - dt.timedelta(seconds=quiet_ago_s)
    conn.execute(  # type: ignore[attr-defined]
        "INSERT INTO deliveries (delivery_id, endpoint_id, app_id, conversion_id, event_type,"
        " event_id, idempotency_key, snapshot, created_at, status, status_at)"
        " VALUES (%s, %s, 'app_gap', %s, 'install', %s, %s, '{}', %s, %s, %s)",
        (delivery_id, endpoint, f"cv_{endpoint}_{n}", f"evt_{n}", f"key_{endpoint}_{n}",
         created, status, status_at))
    return delivery_id


def test_quiet_pending_released_and_replayed_deliveries_are_gaps(settings: Settings,
                                                                   namespace: str) -> None:
    ep = f"ep_{namespace}_gaps"
    with connect(settings.database_url) as conn:
        before, _ = gap_summary(conn, now=NOW, older_than_s=600)
        gaps = [
            _delivery(conn, ep, 1, "pending", created_ago_s=3600, quiet_ago_s=None),
            _delivery(conn, ep, 2, "released", created_ago_s=7200, quiet_ago_s=1800),
            _delivery(conn, ep, 3, "replayed", created_ago_s=86400, quiet_ago_s=900),
        ]
        # not gaps: too recent, re-driven recently, settled, or with their own alert
        _delivery(conn, ep, 4, "pending", created_ago_s=60, quiet_ago_s=None)
        _delivery(conn, ep, 5, "released", created_ago_s=7200, quiet_ago_s=30)
        for i, status in enumerate(("delivered", "dead_lettered", "exhausted", "rejected",
                                    "suppressed", "failing", "quarantined", "held"), 10):
            _delivery(conn, ep, i, status, created_ago_s=7200, quiet_ago_s=3600)
        conn.commit()
        after, oldest = gap_summary(conn, now=NOW, older_than_s=600)
        found = list_gaps(conn, now=NOW, older_than_s=600, limit=10, endpoint_id=ep)
        first = list_gaps(conn, now=NOW, older_than_s=600, limit=1, endpoint_id=ep)
    assert after - before == 3
    assert oldest >= 3600  # the pending one, quiet since it was created
    assert [g.delivery_id for g in found] == [gaps[0], gaps[1], gaps[2]]  # quiet longest first
    assert [g.status for g in found] == ["pending", "released", "replayed"]
    assert [g.delivery_id for g in first] == [gaps[0]]


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POSTBACKS_DATABASE_URL": settings.database_url}
    return subprocess.run([sys.executable, "-m", "postbacks", "gaps", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_gaps_command_lists_them_and_says_so_in_its_exit_code(settings: Settings,
                                                                  namespace: str) -> None:
    ep = f"ep_{namespace}_cli"
    quiet = f"ep_{namespace}_none"
    with connect(settings.database_url) as conn:
        gap = _delivery(conn, ep, 1, "pending", created_ago_s=3600, quiet_ago_s=None)
        _delivery(conn, quiet, 1, "delivered", created_ago_s=3600, quiet_ago_s=3000)
        conn.commit()
    listed = _cli(settings, "--endpoint", ep, "--older-than", "600")
    assert listed.returncode == 1, listed.stderr
    assert gap in listed.stdout and "1 gap(s) quiet for more than 600s" in listed.stdout
    as_json = _cli(settings, "--endpoint", ep, "--json")
    assert as_json.returncode == 1
    (row,) = json.loads(as_json.stdout)
    assert row["delivery_id"] == gap and row["status"] == "pending" and row["quiet_s"] >= 3599
    none = _cli(settings, "--endpoint", quiet)
    assert none.returncode == 0 and "0 gap(s)" in none.stdout
    assert _cli(settings, "--limit", "x").returncode == 2  # argparse: a clear usage error
