"""Attempt-log retention: the daily ``delivery_attempts`` partitions older than the window
are dropped whole (DESIGN: "append-only, partitioned by day, retention job"; the seeds keep
60-90 days hot for replay and support). ``postbacks retention`` runs it; schedule it daily.

A partition ``delivery_attempts_YYYYMMDD`` holds the attempts stamped on that UTC day.
It is expired when its day is more than ``keep_days`` days before today: with 90, on
2026-11-30 the days before 2026-09-01 go, the newest of them 2026-08-31. Each drop is
its own short transaction with a lock timeout (dropping a partition locks its parent, so
a drop waits behind no long query and no writer queues behind it; one that times out is
left for the next run), and writes an audit row with the rows it removed. The
``deliveries`` rows stay: their status and attempt count were projected when the
attempts arrived. The default partition (rows outside every day made) is never dropped.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["DAY_PARTITION", "Expired", "attempt_partitions", "drop_expired", "expired"]

DAY_PARTITION = re.compile(r"^delivery_attempts_(\d{8})$")


@dataclass(frozen=True, slots=True)
class Expired:
    name: str
    day: dt.date
    rows: int
    dropped: bool  # False: a dry run, or the drop timed out waiting for its lock
    error: str | None = None


def attempt_partitions(conn: psycopg.Connection[Any]) -> list[tuple[str, dt.date]]:
    """The daily partitions of ``delivery_attempts`` (name, day), oldest first."""
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'delivery_attempts'::regclass").fetchall()
    out = []
    for (name,) in rows:
        m = DAY_PARTITION.match(name)
        if m:
            out.append((name, dt.datetime.strptime(m.group(1), "%Y%m%d").date()))
    return sorted(out, key=lambda x: x[1])


def expired(partitions: list[tuple[str, dt.date]], today: dt.date,
            keep_days: int) -> list[tuple[str, dt.date]]:
    """Those whose day is more than ``keep_days`` days before ``today``."""
    if keep_days < 2:
        raise ValueError("keep_days must be >= 2 (yesterday's attempts are still written)")
    cutoff = today - dt.timedelta(days=keep_days)
    return [(n, d) for n, d in partitions if d < cutoff]


def drop_expired(database_url: str, *, keep_days: int, today: dt.date, dry_run: bool = False,
                 actor: str = "retention", lock_timeout_s: float = 5.0) -> list[Expired]:
    """Drop the expired partitions (oldest first); returns what was (or would be) dropped."""
    from postbacks.db.connect import connect

    out: list[Expired] = []
    with connect(database_url, autocommit=True) as conn:
        conn.execute(f"SET lock_timeout = '{int(lock_timeout_s * 1000)}ms'")
        for name, day in expired(attempt_partitions(conn), today, keep_days):
            rows = _count(conn, name)
            if dry_run:
                out.append(Expired(name, day, rows, dropped=False))
                continue
            try:
                with conn.transaction():  # nothing writes to a day this old any more
                    conn.execute(f'DROP TABLE "{name}"')
                    conn.execute(
                        "INSERT INTO audit_log (actor, action, target_type, target_id,"
                        " before, note) VALUES (%s, 'drop_partition', 'attempt_partition',"
                        " %s, %s, %s)",
                        (actor, name, json.dumps({"day": day.isoformat(), "rows": rows}),
                         f"older than {keep_days} days"))
                out.append(Expired(name, day, rows, dropped=True))
            except psycopg.errors.LockNotAvailable as exc:
                out.append(Expired(name, day, rows, dropped=False,
                                   error=f"lock not granted in {lock_timeout_s:g} s: {exc}"))
    return out


def _count(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()
    return int(row[0]) if row else 0
