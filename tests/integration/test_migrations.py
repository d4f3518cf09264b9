"""The schema migrations (Alembic, ``postbacks.db.migrate``) against PostgreSQL, each test
on a scratch database of its own: a fresh database reaches head with every table, a second
run is a no-op, two processes migrating at once apply the revisions once, a database kept
by the ``schema_migrations`` bookkeeping is taken over where it stands, and
``pending_migrations`` names what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from importlib import resources

import psycopg
import pytest

from postbacks.db.connect import scratch_database
from postbacks.db.migrate import migrate, pending_migrations
from postbacks.errors import ConfigError

# Every SQL file is one revision, in file order (test_every_sql_file_has_its_revision).
REVISIONS = sorted(e.name.removesuffix(".sql")
                   for e in (resources.files("postbacks") / "db" / "migrations").iterdir()
                   if e.name.endswith(".sql"))
TABLES = {"endpoints", "endpoint_secrets", "deliveries", "delivery_attempts",
          "delivery_attempts_default", "delivery_outcomes", "dead_letters",
          "postback_suppressions", "payout_anomaly_settings", "audit_log", "sink_offsets",
          "console_tokens", "replay_jobs", "replay_items", "config_versions"}
LOCK_ID = 0x706F73746261636B


@pytest.fixture()
def fresh_db(service_env: dict[str, str]) -> Iterator[str]:
    """An empty database of its own on the test server; its URL. Dropped afterwards."""
    with scratch_database(service_env["POSTBACKS_DATABASE_URL"],
                          f"mig_{uuid.uuid4().hex[:10]}") as url:
        yield url


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def _version(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]


def _sql(revision: str) -> bytes:
    return (resources.files("postbacks") / "db" / "migrations" / f"{revision}.sql").read_bytes()


def _legacy_migrate(url: str, upto: int) -> None:
    """The database as the ``schema_migrations`` bookkeeping leaves it: files 1..upto
    applied, one row each."""
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY,"
                     " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        for rev in REVISIONS[:upto]:
            conn.execute(_sql(rev))
            conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                         (int(rev[:4]), f"{rev}.sql"))
        conn.commit()


def test_every_sql_file_has_its_revision() -> None:
    sql = sorted(e.name.removesuffix(".sql")
                 for e in (resources.files("postbacks") / "db" / "migrations").iterdir()
                 if e.name.endswith(".sql"))
    versions = sorted(e.name.removesuffix(".py")
                      for e in (resources.files("postbacks") / "db" / "alembic" / "versions")
                      .iterdir() if e.name.endswith(".py"))
    assert sql == versions == REVISIONS


def test_a_fresh_database_reaches_head_and_a_second_run_does_nothing(fresh_db: str) -> None:
    assert pending_migrations(fresh_db) == REVISIONS
    assert migrate(fresh_db) == REVISIONS
    tables = _tables(fresh_db)
    assert tables >= TABLES
    assert any(t.startswith("delivery_attempts_2") for t in tables)  # the coming days
    assert _version(fresh_db) == [REVISIONS[-1]]
    assert pending_migrations(fresh_db) == []
    assert migrate(fresh_db) == []
    assert _version(fresh_db) == [REVISIONS[-1]]


def test_a_schema_newer_than_this_release_is_a_clear_error(fresh_db: str) -> None:
    """A rollback to a release that does not know the database's revision: the console's
    start check says so (exit 2 through ConfigError) instead of a traceback."""
    migrate(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_from_a_newer_release'")
    with pytest.raises(ConfigError, match="9999_from_a_newer_release"):
        pending_migrations(fresh_db)
    serve = subprocess.run([sys.executable, "-m", "postbacks", "console", "serve"],
                           env={**os.environ, "POSTBACKS_DATABASE_URL": fresh_db},
                           capture_output=True, text=True, timeout=60, check=False)
    assert serve.returncode == 2 and "newer than this release" in serve.stderr
    assert "Traceback" not in serve.stderr


def test_pending_migrations_lists_what_is_missing_and_changes_nothing(fresh_db: str) -> None:
    _legacy_migrate(fresh_db, upto=1)
    before = _tables(fresh_db)
    assert pending_migrations(fresh_db) == REVISIONS[1:]
    assert _tables(fresh_db) == before  # read only: no version table made
    assert migrate(fresh_db) == REVISIONS[1:]
    assert _tables(fresh_db) >= TABLES
    assert pending_migrations(fresh_db) == []


def test_a_database_kept_by_the_schema_migrations_bookkeeping_is_taken_over(
        fresh_db: str) -> None:
    _legacy_migrate(fresh_db, upto=len(REVISIONS))
    assert pending_migrations(fresh_db) == []
    assert migrate(fresh_db) == []  # stamped at head: no file runs twice
    assert _version(fresh_db) == [REVISIONS[-1]]
    assert migrate(fresh_db) == []


def test_two_processes_migrating_at_once_apply_the_revisions_once(fresh_db: str) -> None:
    """Both runners are started while the test holds the migration lock, and it is let go
    once both wait on it, so they really contend."""
    code = ("import json, sys; from postbacks.db.migrate import migrate;"
            " print(json.dumps(migrate(sys.argv[1])))")
    with psycopg.connect(fresh_db, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (LOCK_ID,))
        procs = [subprocess.Popen([sys.executable, "-c", code, fresh_db],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        try:
            deadline = time.monotonic() + 60
            while True:
                (waiting,) = holder.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                    " WHERE l.locktype = 'advisory' AND NOT l.granted"
                    " AND d.datname = current_database()").fetchone() or (0,)
                if waiting == 2:
                    break
                assert all(p.poll() is None for p in procs), "a runner ended before the lock"
                assert time.monotonic() < deadline, f"{waiting} of 2 runners wait on the lock"
                time.sleep(0.05)
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (LOCK_ID,))
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(outs, key=len) == [[], REVISIONS]
    assert _version(fresh_db) == [REVISIONS[-1]]
    assert _tables(fresh_db) >= TABLES


def test_a_failing_revision_keeps_the_ones_before_it_and_releases_the_lock(
        fresh_db: str) -> None:
    """Each revision commits on its own: 0002 fails on a table already there, 0001 stays
    applied and recorded, and the lock is free for the next run."""
    with psycopg.connect(fresh_db) as conn:
        conn.execute("CREATE TABLE console_tokens (x integer)")
        conn.commit()
    with pytest.raises(Exception, match="console_tokens"):
        migrate(fresh_db)
    assert _version(fresh_db) == [REVISIONS[0]]
    assert pending_migrations(fresh_db) == REVISIONS[1:]
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_ID,)).fetchone() == (True,)
