"""Schema migrations with Alembic over a SQLAlchemy Core engine (psycopg 3 driver).

The DDL lives in ``migrations/NNNN_name.sql``; each Alembic revision
``alembic/versions/NNNN_name.py`` (revision id ``NNNN_name``) executes its file, in its
own transaction with its ``alembic_version`` row. Upgrades run under a PostgreSQL
advisory lock, so concurrent runners don't race: the second waits, then finds nothing to
do. A database whose files are recorded in a ``schema_migrations`` table (the bookkeeping
of releases without Alembic) is stamped at the revision that table reached, then upgraded
as usual; the table is left as it is. The Alembic configuration is built here (no
``alembic.ini``), its scripts found in the package. docs/decisions/0006-migrations.md has
the measurements behind the choice.

SQLAlchemy and Alembic are imported only when a migration function runs: the sink imports
:func:`ensure_attempt_partitions` and :class:`DayPartitions` from here and needs neither.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from postbacks.db.connect import connect
from postbacks.errors import ConfigError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy import Connection, Engine

__all__ = ["ensure_attempt_partitions", "migrate", "pending_migrations", "run_sql_file"]

_LOCK_ID = 0x706F73746261636B  # "postback"
_LEGACY_TABLE = "schema_migrations"


def _package_dir(*parts: str) -> Path:
    # An installed wheel unpacks to real files, which Alembic reads by path.
    return Path(str(resources.files("postbacks").joinpath("db", *parts)))


def run_sql_file(revision: str) -> None:
    """Executes ``migrations/<revision>.sql`` on the migration's connection: the body of
    every revision (called from ``upgrade()``)."""
    from alembic import op

    sql = _package_dir("migrations", f"{revision}.sql").read_bytes()
    # Straight to psycopg, inside the transaction Alembic opened for this revision: with
    # no parameters it sends the text as-is (several statements, ``%`` in function bodies
    # left alone), which SQLAlchemy's execute paths would not.
    driver = op.get_bind().connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    driver.execute(sql)


def _engine(database_url: str) -> Engine:
    from sqlalchemy import create_engine, pool

    # The project's connect(): the same libpq URL or key=value string as everywhere, the
    # same clear error when PostgreSQL is not there.
    return create_engine("postgresql+psycopg://", poolclass=pool.NullPool,
                         creator=lambda: connect(database_url))


def _config(connection: Connection, applied: list[str] | None = None) -> Config:
    from alembic.config import Config

    cfg = Config(attributes={"connection": connection, "applied": applied})
    cfg.set_main_option("script_location", str(_package_dir("alembic")))
    cfg.set_main_option("path_separator", "os")
    return cfg


def _scripts(cfg: Config) -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(cfg)


def _legacy_revision(connection: Connection, scripts: ScriptDirectory) -> str | None:
    """The revision the ``schema_migrations`` bookkeeping reached (its versions 1..N all
    applied), or None when the table is absent or records nothing."""
    from sqlalchemy import text

    if connection.scalar(text("SELECT to_regclass(:t)"), {"t": _LEGACY_TABLE}) is None:
        return None
    done = set(connection.scalars(text(f"SELECT version FROM {_LEGACY_TABLE}")))
    reached = None
    for script in reversed(list(scripts.walk_revisions())):  # base first
        if int(script.revision[:4]) not in done:
            break
        reached = script.revision
    return reached


def _current(connection: Connection, scripts: ScriptDirectory) -> tuple[str, ...]:
    from alembic.runtime.migration import MigrationContext

    heads = MigrationContext.configure(connection).get_current_heads()
    if heads:
        return heads
    legacy = _legacy_revision(connection, scripts)
    return (legacy,) if legacy else ()


def pending_migrations(database_url: str) -> list[str]:
    """The revisions not yet applied, oldest first (empty when the schema is at head).
    Reads only: nothing is created or stamped."""
    engine = _engine(database_url)
    try:
        with engine.connect() as conn:
            scripts = _scripts(_config(conn))
            current = _current(conn, scripts)
            conn.rollback()
    finally:
        engine.dispose()
    unknown = [r for r in current if r not in {s.revision for s in scripts.walk_revisions()}]
    if unknown:
        raise ConfigError(f"the database schema is at {', '.join(unknown)}, newer than this "
                          "release knows: run the release that migrated it")
    todo = scripts.iterate_revisions("heads", current[0] if current else "base")
    return [s.revision for s in reversed(list(todo)) if s.revision not in current]


def migrate(database_url: str) -> list[str]:
    """Apply every pending revision; returns the revision ids applied (empty when up to
    date), then makes sure the coming days' attempt partitions exist."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import text

    applied: list[str] = []
    engine = _engine(database_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_ID})
            conn.commit()
            try:
                cfg = _config(conn, applied)
                heads = MigrationContext.configure(conn).get_current_heads()
                legacy = None if heads else _legacy_revision(conn, _scripts(cfg))
                conn.rollback()  # only read: Alembic opens one transaction per revision
                if legacy:
                    command.stamp(cfg, legacy)
                command.upgrade(cfg, "head")
                today = dt.datetime.now(dt.UTC).date()
                conn.execute(text("SELECT postbacks_ensure_attempt_partitions(:d, 8)"),
                             {"d": today - dt.timedelta(days=1)})
                conn.commit()
            finally:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_ID})
                conn.commit()
    finally:
        engine.dispose()
    return applied


def ensure_attempt_partitions(conn: psycopg.Connection, today: dt.date, ahead: int = 8) -> int:
    row = conn.execute(
        "SELECT postbacks_ensure_attempt_partitions(%s, %s)", (today - dt.timedelta(days=1), ahead)
    ).fetchone()
    return int(row[0]) if row else 0


log = logging.getLogger(__name__)


class DayPartitions:
    """The coming week's daily partitions, made again each UTC day on a connection that
    lives for days (the sink's): made only at connect, a sink up for a week wrote every
    later day into the default partitions, which retention never drops and which make
    each later partition's creation scan them under its parent's lock.

    :meth:`keep` runs after a write. It makes them in a short transaction of its own
    under a short lock timeout: creating a partition locks its parent, so it must not wait
    behind a long query, and the readers and writers that queue behind its request wait
    at most that long. When it cannot (a lock held, another sink making the same
    partition) it is logged and tried again ``retry_s`` later: there are days to spare.
    """

    def __init__(self, *, lock_timeout_ms: int = 1000, retry_s: float = 300.0,
                 today: Callable[[], dt.date] = lambda: dt.datetime.now(dt.UTC).date(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lock_timeout_ms = lock_timeout_ms
        self.retry_s = retry_s
        self._today = today
        self._clock = clock
        self._done: dt.date | None = None
        self._next_try = 0.0

    def keep(self, conn: psycopg.Connection) -> bool:
        """Make the partitions if today's round is not done; True when they are made
        (or were today). Only on a connection outside a transaction (run after a write's
        commit): inside one, the partitions' lock would last until its end. Never raises
        for a database error: the next write meets a broken connection itself."""
        today = self._today()
        if self._done == today:
            return True
        if (self._clock() < self._next_try
                or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE):
            return False
        try:
            with conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = {int(self.lock_timeout_ms)}")
                ensure_attempt_partitions(conn, today)
        except psycopg.Error as exc:
            self._next_try = self._clock() + self.retry_s
            log.warning("could not make the coming days' partitions (%s); trying again in "
                        "%g s", str(exc).strip() or type(exc).__name__, self.retry_s)
            return False
        self._done = today
        return True
