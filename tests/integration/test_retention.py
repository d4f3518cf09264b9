"""The attempt-log retention job against PostgreSQL: expired daily partitions of
``delivery_attempts`` are dropped whole with an audit row, the window and the default
partition are kept, a dry run drops nothing, a drop that cannot get its lock is left for
the next run, and the command refuses a window that would drop a day still written."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest

from postbacks.db.connect import connect
from postbacks.db.retention import (
    attempt_partitions,
    day_partitions,
    drop_expired,
    expired,
    overdue_days,
)

# Days long past (no test writes attempts then), so the partitions made here hold only
# the rows put in them.
OLD = (dt.date(2001, 1, 1), dt.date(2001, 1, 2))


def _old_partitions(url: str) -> None:
    with connect(url) as conn:
        conn.execute("SELECT postbacks_ensure_attempt_partitions(%s, 2)", (OLD[0],))
        conn.execute(
            "INSERT INTO delivery_attempts (attempt_id, attempted_at, delivery_id, endpoint_id,"
            " idempotency_key, attempt_no, trigger, result, queue_ms, platform_ms, wire_ms,"
            " request_method, request_url, request_headers)"
            " VALUES ('att_retention_old', '2001-01-01T12:00:00Z', 'dlv_retention_old',"
            " 'ep_retention', 'k', 1, 'first', 'delivered', 0, 0, 0, 'POST',"
            " 'https://example.com/', '{}')")
        conn.commit()


def _names(url: str) -> set[str]:
    with connect(url) as conn:
        return {n for n, _d in attempt_partitions(conn)}


def test_expired_days_are_those_more_than_keep_days_before_today() -> None:
    parts = [(f"p{i}", dt.date(2026, 11, 30) - dt.timedelta(days=i)) for i in range(95)]
    got = expired(parts, dt.date(2026, 11, 30), 90)
    assert [d for _n, d in got] == [dt.date(2026, 11, 30) - dt.timedelta(days=i)
                                    for i in range(91, 95)]
    with pytest.raises(ValueError, match=">= 2"):
        expired(parts, dt.date(2026, 11, 30), 1)


def test_expired_partitions_are_dropped_with_an_audit_row_and_the_window_kept(
        migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    _old_partitions(url)
    today = dt.datetime.now(dt.UTC).date()
    with connect(url) as conn:
        conn.execute("SELECT postbacks_ensure_attempt_partitions(%s, 2)", (today,))
        conn.commit()
    old = {f"delivery_attempts_{d:%Y%m%d}" for d in OLD}
    assert old <= _names(url)

    listed = drop_expired(url, keep_days=90, today=today, dry_run=True)
    assert old <= {x.name for x in listed} and not any(x.dropped for x in listed)
    assert old <= _names(url), "a dry run dropped something"
    rows = {x.name: x.rows for x in listed}
    assert rows[f"delivery_attempts_{OLD[0]:%Y%m%d}"] == 1

    actor = f"test-retention-{uuid.uuid4().hex[:8]}"  # this run's audit rows only
    done = drop_expired(url, keep_days=90, today=today, actor=actor)
    assert old <= {x.name for x in done if x.dropped}
    names = _names(url)
    assert not old & names
    assert f"delivery_attempts_{today:%Y%m%d}" in names  # the window stays
    with connect(url) as conn:
        audit = conn.execute(
            "SELECT target_id, before->>'rows' FROM audit_log WHERE actor = %s"
            " AND action = 'drop_partition' AND target_id = ANY(%s)",
            (actor, sorted(old))).fetchall()
        default = conn.execute("SELECT to_regclass('delivery_attempts_default')").fetchone()
    assert sorted(audit) == [(f"delivery_attempts_{OLD[0]:%Y%m%d}", "1"),
                             (f"delivery_attempts_{OLD[1]:%Y%m%d}", "0")]
    assert default is not None and default[0] is not None  # never dropped


def test_a_drop_that_cannot_get_its_lock_is_left_for_the_next_run(
        migrated: dict[str, str]) -> None:
    url = migrated["POSTBACKS_DATABASE_URL"]
    _old_partitions(url)
    today = dt.datetime.now(dt.UTC).date()
    holder: psycopg.Connection[Any] = connect(url)
    try:  # a long reader of the attempt log holds the parent table
        holder.execute("LOCK TABLE delivery_attempts IN ACCESS SHARE MODE")
        done = drop_expired(url, keep_days=90, today=today, lock_timeout_s=0.3)
    finally:
        holder.rollback()
        holder.close()
    mine = [x for x in done if x.name == f"delivery_attempts_{OLD[0]:%Y%m%d}"]
    assert mine and not mine[0].dropped and mine[0].error and "lock" in mine[0].error
    assert f"delivery_attempts_{OLD[0]:%Y%m%d}" in _names(url)
    assert drop_expired(url, keep_days=90, today=today)  # the next run drops it
    assert f"delivery_attempts_{OLD[0]:%Y%m%d}" not in _names(url)


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "postbacks", "retention", *args],
                          env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)


def test_the_command_lists_drops_and_refuses_a_window_too_short(
        migrated: dict[str, str]) -> None:
    env = dict(migrated)
    _old_partitions(env["POSTBACKS_DATABASE_URL"])
    dry = _cli("--dry-run", **env)
    assert dry.returncode == 0, dry.stderr
    assert f"delivery_attempts_{OLD[0]:%Y%m%d}" in dry.stdout and "would drop" in dry.stdout
    run = _cli(**env)
    assert run.returncode == 0, run.stderr
    assert "dropped" in run.stdout
    again = _cli(**env)
    assert again.returncode == 0 and "no attempt partition older than 90 days" in again.stdout
    short = _cli("--keep-days", "1", **env)
    assert short.returncode == 2
    assert "--keep-days: '1' is not a whole number of at least 2" in short.stderr
    bad = _cli(**env, POSTBACKS_ATTEMPT_RETENTION_DAYS="1")
    assert bad.returncode == 2 and "POSTBACKS_ATTEMPT_RETENTION_DAYS" in bad.stderr


def test_overdue_days_count_from_the_window_edge() -> None:
    today = dt.date(2026, 11, 30)
    window = [("in", today - dt.timedelta(days=90)), ("today", today)]
    assert overdue_days(window, today, 90) == 0
    assert overdue_days([*window, ("late", today - dt.timedelta(days=91))], today, 90) == 1
    assert overdue_days([("older", today - dt.timedelta(days=100)),
                         ("late", today - dt.timedelta(days=91))], today, 90) == 10
    assert overdue_days([], today, 90) == 0


def test_the_monitor_shows_a_retention_job_that_has_not_run(
        migrated: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A retention job that stopped (or whose drops keep failing) leaves partitions past the
    window: ``postbacks_retention_overdue_seconds`` (alert PostbacksRetentionBehind) counts
    how long the oldest has waited, and goes back to 0 once the job has run."""
    from postbacks.metrics import MONITOR_ERRORS, RETENTION_OVERDUE
    from postbacks.monitor import Monitor
    from postbacks.settings import load_settings

    for k, v in migrated.items():
        monkeypatch.setenv(k, v)
    settings = load_settings()
    url = migrated["POSTBACKS_DATABASE_URL"]
    _old_partitions(url)
    monitor = Monitor(settings, reader=None)  # type: ignore[arg-type]
    errors = MONITOR_ERRORS.labels("retention")._value  # type: ignore[attr-defined]
    failed = errors.get()
    monitor._check("retention", monitor._retention)
    assert errors.get() == failed
    today = dt.datetime.now(dt.UTC).date()
    cutoff = today - dt.timedelta(days=settings.attempt_retention_days)
    gauge = RETENTION_OVERDUE.labels("delivery_attempts")._value  # type: ignore[attr-defined]
    assert gauge.get() == 86_400 * (cutoff - OLD[0]).days

    drop_expired(url, keep_days=settings.attempt_retention_days, today=today)
    monitor._check("retention", monitor._retention)
    assert gauge.get() == 0
    assert RETENTION_OVERDUE.labels("deliveries")._value.get() == 0  # type: ignore[attr-defined]


def test_the_monitor_shows_partitions_running_out_and_retention_makes_them(
        migrated: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The coming days' partitions are made by the sink (each day) and by the retention
    job; with neither running they run out, and each later day's rows go to the default
    partition, which retention never drops. ``postbacks_partitions_ahead_seconds`` (alert
    PostbacksPartitionsRunningOut) shows how far ahead they reach."""
    from postbacks.metrics import PARTITIONS_AHEAD
    from postbacks.monitor import Monitor
    from postbacks.settings import load_settings

    for k, v in migrated.items():
        monkeypatch.setenv(k, v)
    settings = load_settings()
    url = migrated["POSTBACKS_DATABASE_URL"]
    monitor = Monitor(settings, reader=None)  # type: ignore[arg-type]
    today = dt.datetime.now(dt.UTC).date()

    def ahead() -> dict[str, float]:
        monitor._check("retention", monitor._retention)
        return {t: PARTITIONS_AHEAD.labels(t)._value.get()  # type: ignore[attr-defined]
                for t in ("delivery_attempts", "deliveries")}

    assert min(ahead().values()) >= 6 * 86_400.0  # made by the migration
    with connect(url) as conn:  # days on with nothing making them: one day left
        for table in ("delivery_attempts", "deliveries"):
            for name, day in day_partitions(conn, table):
                if day > today + dt.timedelta(days=1):
                    conn.execute(f'DROP TABLE "{name}"')
        conn.commit()
    assert ahead() == {"delivery_attempts": 86_400.0, "deliveries": 86_400.0}
    drop_expired(url, keep_days=settings.attempt_retention_days, today=today)
    assert ahead() == {"delivery_attempts": 6 * 86_400.0, "deliveries": 6 * 86_400.0}
