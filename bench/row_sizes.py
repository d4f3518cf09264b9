"""Bytes per row as stored in PostgreSQL (heap, TOAST and indexes), for the capacity model
(docs/capacity.md): a scratch database beside POSTBACKS_DATABASE_URL's, a backlog of
deliveries through the engine (agent -> sink, bench/engine.py), then
``pg_total_relation_size`` of every table's partitions over its rows. Dropped afterwards.
Traffic to 127.0.0.1 only.

Usage: python bench/row_sizes.py [--deliveries 20000]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine import run_engine
from bench.harness import ROOT, cleanup, say, scratch_database
from postbacks.db.connect import connect
from postbacks.settings import load_settings

TABLES = ("deliveries", "delivery_attempts", "delivery_outcomes", "attempt_intents")

# a partitioned table's size is its partitions' (the parent itself holds nothing)
_SIZE = ("SELECT coalesce((SELECT sum(pg_total_relation_size(relid))"
         "  FROM pg_partition_tree(%(t)s::regclass)), pg_total_relation_size(%(t)s::regclass))")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deliveries", type=int, default=20_000)
    args = ap.parse_args()
    base = load_settings()
    with scratch_database(base.database_url, f"rows{int(time.time())}") as url:
        s = dataclasses.replace(base, database_url=url)
        try:
            run_engine(s, args.deliveries, 50, int(time.time()),
                       ROOT / ".local" / "bench-logs" / f"rows-{int(time.time())}")
        finally:
            cleanup()
        with connect(url, autocommit=True) as db:
            db.execute("VACUUM ANALYZE")  # the visibility map and statistics, as in service
            print("\n=== bytes per row as stored (heap + TOAST + indexes) ===")
            for table in TABLES:
                size = db.execute(_SIZE, {"t": table}).fetchone()
                count = db.execute(f"SELECT count(*) FROM {table}").fetchone()
                assert size is not None and count is not None
                per = size[0] / max(1, count[0])
                say(f"{table}: {count[0]:,} rows, {size[0] / 2**20:.1f} MiB, "
                    f"{per:,.0f} bytes per row")
                print(f"{table:12s} {count[0]:>9,} rows {per:>8,.0f} bytes/row")


if __name__ == "__main__":
    main()
