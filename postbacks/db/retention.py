"""Retention of the attempt log and of deliveries: the daily partitions of
``delivery_attempts`` and of ``deliveries`` older than the window are dropped whole (a
delivery's outcome rows and suppression go with it, and dead letters older than the
window are deleted)
(DESIGN: "append-only, partitioned by day, retention job"; the seeds keep 60-90 days hot
for replay and support). ``postbacks retention`` runs it; schedule it daily.

A partition ``delivery_attempts_YYYYMMDD`` holds the attempts stamped on that UTC day, a
partition ``deliveries_YYYYMMDD`` the deliveries created (planned by fan-out) on it. Both
use one window, ``keep_days``: a partition is expired when its day is more than
``keep_days`` days before today: with 90, on 2026-11-30 the days before 2026-09-01 go,
the newest of them 2026-08-31. A delivery and the attempts of its creation day are
dropped in the same run; its later retries' attempts go when their own day expires, so no
attempt is dropped while its delivery's row is kept, and a delivery's row outlives its
last attempts by at most its retry horizon. Each drop is its own short transaction with a
lock timeout (dropping a partition locks its parent, so a drop waits behind no long query
and no writer queues behind it; one that times out is left for the next run), and writes
an audit row with the rows it removed; a deliveries partition's keys (``delivery_keys``)
are deleted in batches just before its drop (:mod:`postbacks.db.delivery_keys`).
The default partitions (rows outside every day made) are never dropped.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

import psycopg

from postbacks.db.delivery_keys import delete_partition_keys
from postbacks.db.migrate import DayPartitions

__all__ = ["DAY_PARTITION", "DELIVERY_PARTITION", "Expired", "attempt_partitions",
           "day_partitions", "delivery_partitions", "drop_expired", "expired", "overdue_days"]

DAY_PARTITION = re.compile(r"^delivery_attempts_(\d{8})$")
DELIVERY_PARTITION = re.compile(r"^deliveries_(\d{8})$")
# parent table -> (partition name pattern, audit target type)
_PARENTS = {"delivery_attempts": (DAY_PARTITION, "attempt_partition"),
            "deliveries": (DELIVERY_PARTITION, "delivery_partition")}


@dataclass(frozen=True, slots=True)
class Expired:
    name: str
    day: dt.date
    rows: int
    dropped: bool  # False: a dry run, or the drop timed out waiting for its lock
    error: str | None = None


def day_partitions(conn: psycopg.Connection[Any], parent: str) -> list[tuple[str, dt.date]]:
    """The daily partitions of ``parent`` (name, day), oldest first."""
    pattern = _PARENTS[parent][0]
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass", (parent,)).fetchall()
    out = []
    for (name,) in rows:
        m = pattern.match(name)
        if m:
            out.append((name, dt.datetime.strptime(m.group(1), "%Y%m%d").date()))
    return sorted(out, key=lambda x: x[1])


def attempt_partitions(conn: psycopg.Connection[Any]) -> list[tuple[str, dt.date]]:
    """The daily partitions of ``delivery_attempts`` (name, day), oldest first."""
    return day_partitions(conn, "delivery_attempts")


def delivery_partitions(conn: psycopg.Connection[Any]) -> list[tuple[str, dt.date]]:
    """The daily partitions of ``deliveries`` (name, day), oldest first."""
    return day_partitions(conn, "deliveries")


def expired(partitions: list[tuple[str, dt.date]], today: dt.date,
            keep_days: int) -> list[tuple[str, dt.date]]:
    """Those whose day is more than ``keep_days`` days before ``today``."""
    if keep_days < 2:
        raise ValueError("keep_days must be >= 2 (yesterday's attempts are still written)")
    cutoff = today - dt.timedelta(days=keep_days)
    return [(n, d) for n, d in partitions if d < cutoff]


def overdue_days(partitions: list[tuple[str, dt.date]], today: dt.date, keep_days: int) -> int:
    """How many days the oldest partition has been past the window (0: none is expired).
    A daily ``postbacks retention`` keeps it at 0 or 1; more means the job is not running,
    or its drops keep failing."""
    late = expired(partitions, today, keep_days)
    return (today - dt.timedelta(days=keep_days) - late[0][1]).days if late else 0


def drop_expired(database_url: str, *, keep_days: int, today: dt.date, dry_run: bool = False,
                 actor: str = "retention", lock_timeout_s: float = 5.0) -> list[Expired]:
    """Drop the expired partitions of both tables, each table's oldest first (attempts,
    then deliveries); returns what was (or would be) dropped."""
    from postbacks.db.connect import connect

    out: list[Expired] = []
    with connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET lock_timeout = '{int(lock_timeout_s * 1000)}ms'")
        for parent, (_pattern, target) in _PARENTS.items():
            for name, day in expired(day_partitions(conn, parent), today, keep_days):
                rows = _count(conn, name)
                if dry_run:
                    out.append(Expired(name, day, rows, dropped=False))
                    continue
                # a deliveries partition's keys first, in batches outside the drop's
                # lock (nothing writes a day this old any more)
                before: dict[str, object] = {"day": day.isoformat(), "rows": rows}
                if parent == "deliveries":
                    before.update(delete_partition_keys(conn, name))
                try:
                    with conn.transaction():
                        conn.execute(f'DROP TABLE "{name}"')
                        conn.execute(
                            "INSERT INTO audit_log (actor, action, target_type, target_id,"
                            " before, note) VALUES (%s, 'drop_partition', %s, %s, %s, %s)",
                            (actor, target, name, json.dumps(before),
                             f"older than {keep_days} days"))
                except psycopg.errors.LockNotAvailable as exc:
                    out.append(Expired(name, day, rows, dropped=False,
                                       error=f"lock not granted in {lock_timeout_s:g} s: {exc}"))
                    continue
                out.append(Expired(name, day, rows, dropped=True))
        gone = _dead_letters(conn, today - dt.timedelta(days=keep_days), keep_days, dry_run,
                             actor)
        if gone is not None:
            out.append(gone)
        if not dry_run:  # and the coming week's, should no sink have made them
            DayPartitions(today=lambda: today).keep(conn)
    return out


def _dead_letters(conn: psycopg.Connection[Any], cutoff: dt.date, keep_days: int,
                  dry_run: bool, actor: str, batch: int = 10_000) -> Expired | None:
    """Delete the dead letters that occurred before ``cutoff`` (resolved or not: their
    deliveries are gone with their partitions), ``batch`` at a time, oldest first."""
    since = dt.datetime.combine(cutoff, dt.time(0), dt.UTC)
    if dry_run:
        row = conn.execute("SELECT count(*) FROM dead_letters WHERE occurred_at < %s",
                           (since,)).fetchone()
        n = int(row[0]) if row else 0
        return Expired("dead_letters", cutoff, n, dropped=False) if n else None
    total = 0
    while True:
        cur = conn.execute(
            "DELETE FROM dead_letters WHERE dead_letter_id IN (SELECT dead_letter_id FROM"
            " dead_letters WHERE occurred_at < %s ORDER BY occurred_at LIMIT %s)",
            (since, batch))
        total += cur.rowcount
        if cur.rowcount < batch:
            break
    if not total:
        return None
    conn.execute(
        "INSERT INTO audit_log (actor, action, target_type, target_id, before, note)"
        " VALUES (%s, 'delete_expired', 'dead_letters', 'dead_letters', %s, %s)",
        (actor, json.dumps({"before": since.isoformat(), "rows": total}),
         f"older than {keep_days} days"))
    return Expired("dead_letters", cutoff, total, dropped=True)


def _count(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()
    return int(row[0]) if row else 0
