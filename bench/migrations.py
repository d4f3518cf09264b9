"""What the schema migrations cost: the project's Alembic path (``postbacks.db.migrate``)
against a hand-written runner (the baseline below: every ``migrations/NNNN_*.sql`` file
in its own transaction, a ``schema_migrations`` table, an advisory lock), in alternating
rounds A B A B.

Measures:
  fresh        an empty database migrated to head (``migrate``);
  check        ``migrate`` on an up-to-date database: the no-op every ``postbacks
               migrate`` pays (in-process, imports warm);
  pending      ``pending_migrations`` on an up-to-date database: what the console's
               start pays (in-process);
  cold-check   a new Python process that imports the runner and runs the no-op
               ``migrate``: what a ``postbacks migrate`` start really pays, imports
               included (wall time of the process).

Scratch databases (``<database>_migbench_<pid>_*``) are created on the server of
POSTBACKS_DATABASE_URL and dropped afterwards. Bounded: ``--rounds`` x 2 runners x the
four measures (``--inner`` calls per in-process no-op sample, their median kept).

Usage: python bench/migrations.py [--rounds 7] [--inner 5]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from postbacks.db.connect import connect  # noqa: E402

# --- the baseline: a hand-written runner over the same SQL files ------------------------

_LOCK_ID = 0x706F73746261636B
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def _own_files() -> list[tuple[int, str, str]]:
    folder = resources.files("postbacks") / "db" / "migrations"
    out = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            out.append((int(m.group(1)), entry.name, entry.read_text()))
    return sorted(out)


def _own_applied(conn: psycopg.Connection) -> set[int]:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    return {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}


def own_pending(database_url: str) -> list[str]:
    with connect(database_url) as conn:
        done = _own_applied(conn)
        conn.commit()
    return [name for v, name, _ in _own_files() if v not in done]


def own_migrate(database_url: str) -> list[str]:
    applied: list[str] = []
    with connect(database_url) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_ID,))
        try:
            done = _own_applied(conn)
            conn.commit()
            for version, name, sql in _own_files():
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (version, name),
                    )
                applied.append(name)
            today = dt.datetime.now(dt.UTC).date()
            conn.execute("SELECT postbacks_ensure_attempt_partitions(%s, 8)",
                         (today - dt.timedelta(days=1),))
            conn.commit()
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_ID,))
            conn.commit()
    return applied


# --- the runners under test ---------------------------------------------------------------

RUNNERS = ("own", "alembic")


def _runner(name: str) -> tuple[Callable[[str], list[str]], Callable[[str], list[str]]]:
    if name == "own":
        return own_migrate, own_pending
    from postbacks.db.migrate import migrate, pending_migrations

    return migrate, pending_migrations


def _child(name: str, url: str) -> None:
    migrate, _ = _runner(name)
    if migrate(url):
        raise SystemExit(f"{name}: the database was not up to date")


# --- scratch databases --------------------------------------------------------------------

class Scratch:
    def __init__(self, base_url: str) -> None:
        from psycopg.conninfo import conninfo_to_dict

        from postbacks.db.connect import with_dbname

        self._with = with_dbname
        self.base = base_url
        self.prefix = f"{conninfo_to_dict(base_url).get('dbname') or 'postbacks'}" \
                      f"_migbench_{os.getpid()}"
        self.admin = psycopg.connect(with_dbname(base_url, "postgres"), autocommit=True)
        self.made: set[str] = set()
        self.n = 0

    def create(self) -> tuple[str, str]:
        self.n += 1
        name = f"{self.prefix}_{self.n}"
        self.admin.execute(f'CREATE DATABASE "{name}"')
        self.made.add(name)
        return name, self._with(self.base, name)

    def drop(self, name: str) -> None:
        self.admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.made.discard(name)

    def close(self) -> None:
        for name in list(self.made):
            self.drop(name)
        self.admin.close()


@contextlib.contextmanager
def scratch(base_url: str) -> Iterator[Scratch]:
    s = Scratch(base_url)
    try:
        yield s
    finally:
        s.close()


# --- measuring ----------------------------------------------------------------------------

def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--child", choices=RUNNERS, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.url)
        return 0
    if args.rounds < 5:
        ap.error("--rounds must be at least 5")

    from postbacks.settings import load_settings

    base = load_settings().database_url
    runners = {name: _runner(name) for name in RUNNERS}
    measures = ("fresh", "check", "pending", "cold-check")
    samples: dict[str, dict[str, list[float]]] = {m: {r: [] for r in RUNNERS} for m in measures}
    with scratch(base) as s:
        ready = {}
        for name, (migrate, pending) in runners.items():  # one up-to-date database each
            _, url = s.create()
            migrate(url)
            if pending(url):
                raise SystemExit(f"{name}: pending after migrate")
            ready[name] = url
        for rnd in range(args.rounds):
            order = RUNNERS if rnd % 2 == 0 else RUNNERS[::-1]
            for name in order:
                migrate, pending = runners[name]
                db, url = s.create()
                samples["fresh"][name].append(_timed(lambda: migrate(url)))  # noqa: B023
                s.drop(db)
                up = ready[name]
                samples["check"][name].append(statistics.median(
                    _timed(lambda: migrate(up)) for _ in range(args.inner)))  # noqa: B023
                samples["pending"][name].append(statistics.median(
                    _timed(lambda: pending(up)) for _ in range(args.inner)))  # noqa: B023
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name,
                       "--url", up]
                samples["cold-check"][name].append(
                    _timed(lambda: subprocess.run(cmd, check=True)))  # noqa: B023
            print(f"[bench] round {rnd + 1}/{args.rounds}: " + "  ".join(
                f"{m} {samples[m]['own'][-1]:.1f}/{samples[m]['alembic'][-1]:.1f}"
                for m in measures) + " ms (own/alembic)", flush=True)

    print(f"\nmedians of {args.rounds} alternating rounds, ms "
          f"(check and pending: median of {args.inner} calls per round)")
    print(f"{'measure':<12} {'own runner':>11} {'alembic':>9} {'ratio':>7} {'diff':>8}")
    for m in measures:
        own, alem = (statistics.median(samples[m][r]) for r in RUNNERS)
        print(f"{m:<12} {own:>11.1f} {alem:>9.1f} {alem / own:>6.2f}x {alem - own:>+7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
