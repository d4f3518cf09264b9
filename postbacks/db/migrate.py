"""Versioned migrations: ``migrations/NNNN_name.sql``, applied in order, each in its own
transaction, under an advisory lock so concurrent runners don't race."""

from __future__ import annotations

import datetime as dt
import re
from importlib import resources

import psycopg

from postbacks.db.connect import connect

__all__ = ["ensure_attempt_partitions", "migrate", "pending_migrations"]

_LOCK_ID = 0x706F73746261636B  # "postback"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def _migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("postbacks") / "db" / "migrations"
    out = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            out.append((int(m.group(1)), entry.name, entry.read_text()))
    return sorted(out)


def _applied(conn: psycopg.Connection) -> set[int]:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    return {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}


def pending_migrations(database_url: str) -> list[str]:
    with connect(database_url) as conn:
        done = _applied(conn)
        conn.commit()
    return [name for v, name, _ in _migrations() if v not in done]


def migrate(database_url: str) -> list[str]:
    """Apply every pending migration; returns the names applied (empty when up to date)."""
    applied: list[str] = []
    with connect(database_url) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))
        try:
            done = _applied(conn)
            conn.commit()
            for version, name, sql in _migrations():
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (version, name),
                    )
                applied.append(name)
            ensure_attempt_partitions(conn, dt.datetime.now(dt.UTC).date())
            conn.commit()
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))
            conn.commit()
    return applied


def ensure_attempt_partitions(conn: psycopg.Connection, today: dt.date, ahead: int = 8) -> int:
    row = conn.execute(
        "SELECT postbacks_ensure_attempt_partitions(%s, %s)", (today - dt.timedelta(days=1), ahead)
    ).fetchone()
    return int(row[0]) if row else 0
