"""Replay-console benchmark (request latency and bulk replay; traffic to 127.0.0.1 only).

1. **List page latency over 1 M deliveries**: ``--rows`` deliveries (default 1,000,000:
   ~2,000 endpoints over ~200 apps with a Zipf-like skew, mostly delivered, some failing /
   dead-lettered / held, ``last_error`` set on failures, ``created_at`` over 30 days in
   insertion order) are COPYed into ``deliveries`` with a unique id prefix, then ANALYZEd.
   A console server (``postbacks console serve --no-drain``) answers sequential GETs
   (round-robin over the cases, after a warm-up) of ``/deliveries`` (HTML) and
   ``/api/v1/deliveries`` (JSON) with a support token and a publisher token: unfiltered
   first page, a page 20 pages deep by cursor, by app, by endpoint, by status, by error
   class, by date range, app + status, and the first page of a publisher of the biggest
   app and of a median-sized app. p50/p95/p99 per case,
   the query's own time in-process, and ``EXPLAIN (ANALYZE, BUFFERS)`` of each case's SQL.
   The rows are deleted at the end (unless ``--keep``).
2. **Bulk replay vs first attempts**: fresh topics (a prefix), a local receiver answering
   200, ``--endpoints`` endpoints, ``relay``, ``agent``, ``sink`` and a console server
   (whose drainer runs at ``--cap`` per endpoint/s and ``--cap-total``/s) are started; first
   attempts are produced straight onto ``dispatch.v1`` at ``--rate``/s. After a baseline of
   ``--seconds``, a bulk replay of ``--replay`` stored deliveries (inserted for those
   endpoints) is queued as an admin; first attempts continue until it has drained. First-
   attempt latency (``attempts.v1`` attempted_at - the record's enqueued_at) p50/p99 without
   vs with the replay draining, and the drain rate achieved (``replay_items.published_at``
   and the retry topic's record timestamps) vs the cap.

Results go to stdout and ``bench/results/console-latest.json``. Usage:
``python bench/console.py [--rows 1000000] [--requests 200] [--replay 10000] [--rate 300]
[--seconds 40] [--cap 5] [--cap-total 100] [--skip-list] [--skip-replay] [--keep]``.
Needs the services and KAFKA_BOOTSTRAP_SERVERS / POSTBACKS_DATABASE_URL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.console_list import run_list
from bench.console_replay import run_replay
from bench.harness import ROOT, say
from postbacks.db.migrate import migrate
from postbacks.settings import load_settings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="deliveries loaded (list)")
    ap.add_argument("--requests", type=int, default=200,
                    help="timed GETs per case and page (list)")
    ap.add_argument("--replay", type=int, default=10_000, help="deliveries bulk-replayed")
    ap.add_argument("--rate", type=float, default=300.0,
                    help="first attempts produced per second (replay)")
    ap.add_argument("--seconds", type=float, default=40.0,
                    help="baseline window before the replay is queued (replay)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds of first attempts before the baseline window")
    ap.add_argument("--cap", type=float, default=5.0,
                    help="replay cap per endpoint per second (console_replay_rate_per_endpoint)")
    ap.add_argument("--cap-total", type=float, default=100.0,
                    help="replay cap in all per second (console_replay_rate_total)")
    ap.add_argument("--case-budget-s", type=float, default=30.0,
                    help="stop timing a list case (per page) after this many seconds")
    ap.add_argument("--endpoints", type=int, default=20, help="endpoints (replay)")
    ap.add_argument("--skip-list", action="store_true", help="skip the list-latency part")
    ap.add_argument("--skip-replay", action="store_true", help="skip the bulk-replay part")
    ap.add_argument("--keep", action="store_true", help="keep the loaded deliveries (list)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "console-latest.json"))
    args = ap.parse_args()
    base = load_settings(os.environ)
    migrate(base.database_url)
    log_dir = ROOT / ".local" / "bench-logs" / f"console-{int(time.time())}"
    results: dict[str, Any] = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "log_dir": str(log_dir),
        "console_code": {p.name: time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                               time.gmtime(p.stat().st_mtime))
                         for p in sorted((ROOT / "replay_console").glob("*.py"))},
    }
    t0 = time.perf_counter()
    if not args.skip_list:
        results["list"] = run_list(base, args, log_dir)
    if not args.skip_replay:
        results["replay"] = run_replay(base, args, log_dir)
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["elapsed_s"] = round(time.perf_counter() - t0)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2, default=str) + "\n")
    say(f"results in {args.out} ({results['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
