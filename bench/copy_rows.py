"""The sink's write path alone: CPU per delivery (its three rows: delivery, attempt,
outcome) of PostgreSQL's backend and of the writing client, in alternating rounds.

Parts:
  formats   the sink's binary COPY (``sinks.tables``) against text COPY of the
            same rows (the text format, for comparison);
  indexes   binary COPY into databases migrated as shipped, without the guard trigger
            on ``deliveries`` (which the sink's writes skip by its ``WHEN``), and with
            the two status indexes partial (``WHERE status <> 'delivered'``): what the
            guard and those indexes cost.

Rows are built by the sink's own row functions from planned deliveries with a realistic
signed request (~600-byte body), new ids every round. Scratch databases
(``<database>_copybench_*``) are created on the server of POSTBACKS_DATABASE_URL and
dropped afterwards. PostgreSQL's CPU is read from ``/proc``: the server must run on this
machine (``make services-up``). Bounded: ``--deliveries`` x ``--rounds`` x variants.

Usage: python bench/copy_rows.py [--part formats|indexes] [--deliveries 20000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import delivered_records, own_cpu_s, say, scratch_database
from postbacks.settings import load_settings
from sinks.tables import TABLES, column_types, use_orjson

ORDER = ("deliveries", "attempts", "outcomes")
INDEX_VARIANTS: dict[str, list[str]] = {
    "as_shipped": [],
    "no_guard": ["DROP TRIGGER deliveries_key ON deliveries"],
    "partial_status": [
        "DROP INDEX deliveries_status_idx", "DROP INDEX deliveries_app_status_idx",
        "CREATE INDEX deliveries_status_idx ON deliveries (status, created_at DESC,"
        " delivery_id DESC) WHERE status <> 'delivered'",
        "CREATE INDEX deliveries_app_status_idx ON deliveries (app_id, status, created_at"
        " DESC, delivery_id DESC) WHERE status <> 'delivered'"],
}


def build_rows(n: int, seed: int) -> dict[str, list[tuple[Any, ...]]]:
    """n deliveries' rows, as the sink builds them from the records it reads."""
    rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in ORDER}
    for d, a, o in delivered_records(n, seed, f"cb{seed}"):
        row = TABLES["deliveries"].row(d)
        rows["deliveries"].append((*row[:11], "delivered", row[10], None, None, 1, None))
        rows["attempts"].append(TABLES["attempts"].row(a))
        rows["outcomes"].append(TABLES["outcomes"].row(o))
    return rows


def as_text_rows(rows: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """The rows as a text COPY would carry them: jsonb values dumped to
    text by orjson when the row was built (here before the timed window, which favours
    text COPY by that dump: the binary path dumps inside it)."""
    return {name: [tuple(orjson.dumps(v).decode() if isinstance(v, dict) else v for v in r)
                   for r in rs] for name, rs in rows.items()}


def _text_copy(conn: psycopg.Connection[Any], table: str, cols: tuple[str, ...],
               rows: list[tuple[Any, ...]]) -> None:
    """In a savepoint, as the sink's direct COPY was and is (``Table.write``)."""
    with conn.transaction(), conn.cursor() as cur, cur.copy(
            f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
        for r in rows:
            copy.write_row(r)


def write(conn: psycopg.Connection[Any], rows: dict[str, list[tuple[Any, ...]]],
          binary: bool, batch: int) -> None:
    types = column_types(conn)
    n = len(rows["deliveries"])
    for i in range(0, n, batch):
        with conn.transaction():
            for name in ORDER:
                t, chunk = TABLES[name], rows[name][i:i + batch]
                if binary:
                    t.write(conn, chunk, types=types[name])
                else:
                    _text_copy(conn, t.target, t.columns, chunk)


def measure(url: str, rows: dict[str, list[tuple[Any, ...]]], binary: bool,
            batch: int) -> tuple[float, float]:
    """(PostgreSQL's backend's, the client's) CPU µs per delivery for writing ``rows``
    (PostgreSQL's WAL writer, checkpointer and autovacuum are not counted)."""
    with psycopg.connect(url, autocommit=True) as conn:
        use_orjson(conn)
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        stat, comm = Path(f"/proc/{row[0]}/stat"), Path(f"/proc/{row[0]}/comm")
        if not comm.exists() or not comm.read_text().startswith("postgres"):
            raise SystemExit("PostgreSQL's backend is not a process of this machine: run "
                             "the bench against the local services (make services-up)")

        def backend_s() -> float:
            f = stat.read_text().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

        pg0, me0 = backend_s(), own_cpu_s()
        write(conn, rows, binary, batch)
        n = len(rows["deliveries"])
        return (backend_s() - pg0) / n * 1e6, (own_cpu_s() - me0) / n * 1e6


def run(variants: dict[str, tuple[str, bool]], rounds: int, n: int, batch: int,
        seed: Callable[[int, int], int]) -> None:
    got: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for r in range(rounds):  # alternating: the order flips every round
        names = list(variants) if r % 2 == 0 else list(reversed(variants))
        for j, v in enumerate(names):
            rows = build_rows(n, seed(r, j))
            url, binary = variants[v]
            if not binary:
                rows = as_text_rows(rows)
            pg, me = measure(url, rows, binary, batch)
            got[v].append((pg, me))
            say(f"round {r + 1}/{rounds} {v}: PostgreSQL {pg:.1f} µs, client {me:.1f} µs "
                "per delivery")
    for v, xs in got.items():
        pgs, mes = [x[0] for x in xs], [x[1] for x in xs]
        say(f"{v}: PostgreSQL median {statistics.median(pgs):.1f} µs ({min(pgs):.1f}-"
            f"{max(pgs):.1f}), client median {statistics.median(mes):.1f} µs "
            f"({min(mes):.1f}-{max(mes):.1f}) per delivery, {len(xs)} rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("formats", "indexes"), default="formats")
    ap.add_argument("--deliveries", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batch", type=int, default=400, help="rows per table per transaction")
    args = ap.parse_args()
    if not 0 < args.deliveries <= 200_000 or not 0 < args.rounds <= 20:
        ap.error("--deliveries must be 1..200000 and --rounds 1..20")
    base = load_settings().database_url
    stamp = int(time.time())
    with contextlib.ExitStack() as dbs:
        if args.part == "formats":
            url = dbs.enter_context(scratch_database(base, "copybench_formats"))
            variants = {"binary COPY": (url, True), "text COPY": (url, False)}
        else:
            variants = {v: (dbs.enter_context(scratch_database(base, f"copybench_{v}",
                                                                statements)), True)
                        for v, statements in INDEX_VARIANTS.items()}
        run(variants, args.rounds, args.deliveries, args.batch,
            lambda r, j: stamp * 100 + r * 10 + j)

if __name__ == "__main__":
    main()
