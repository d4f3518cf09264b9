"""The ``postbacks`` command: one entry point for every stage and tool.

Settings are read from the environment here, once, and passed down. Configuration and
service errors print one clear line and exit 2; nothing else prints a traceback at start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from postbacks.cli_args import finite, port, whole
from postbacks.core.ssrf import deny_networks
from postbacks.errors import ConfigError, InvalidRecord, ServiceUnavailable
from postbacks.settings import Settings, load_settings
from postbacks.settings_env import dev_keys_in_use, unknown_names

__all__ = ["main"]


def _stage(name: str) -> Callable[[Settings, argparse.Namespace], int]:
    def run(settings: Settings, _args: argparse.Namespace) -> int:
        from postbacks.runtime import settle_gc, setup_process

        stop = setup_process(name, settings)
        for unknown in unknown_names(os.environ):
            logging.getLogger(name).warning("%s is not a setting: ignored", unknown)
        for key in dev_keys_in_use(settings):
            logging.getLogger(name).warning(
                "%s is not set: the development key in postbacks' source is used; set a "
                "random secret of your own before production (docs/operators.md)", key)
        if name == "fanout":
            from streams.fanout import run_fanout as runner
        elif name == "gate":
            from streams.gate import run_gate as runner
        elif name == "agent":
            from streams.agent import run_agent as runner
        elif name == "relay":
            from streams.relay import run_relay as runner
        elif name == "monitor":
            from postbacks.monitor import run_monitor as runner
        elif name == "notifier":
            from streams.notifier import run_notifier as runner
        else:
            from sinks.run import run_sink as runner
        settle_gc(settings.gc_gen0_threshold)  # after the runner's imports
        try:
            runner(settings, stop)
        except ServiceUnavailable as exc:
            from postbacks.kafka.watchdog import restart_in_place, restarts_so_far

            if stop.is_set() or not restarts_so_far():
                raise  # a fresh start fails fast, with the error
            # a copy restarted in place (the brokers or PostgreSQL went away mid-run):
            # wait for them here, counted, rather than exit and stay down; a SIGTERM
            # meanwhile ends it
            logging.getLogger(name).warning("%s: %s; trying again in 5 s", name, exc)
            if stop.wait(5.0):
                return 0
            restart_in_place(f"{name}: {exc}; trying again")
        except KafkaException as exc:
            if stop.is_set():
                raise
            # The client is unusable (e.g. a fatal transactional state after a broker
            # restart): start afresh; nothing uncommitted is lost, offsets are in Kafka.
            from postbacks.kafka.watchdog import restart_in_place

            restart_in_place(f"{name}: Kafka client error {exc}", backoff_s=2.0)
        return 0

    return run


def _gaps(settings: Settings, args: argparse.Namespace) -> int:
    import datetime as dt

    from postbacks.cli_output import iso, print_json, print_table
    from postbacks.db.connect import connect
    from postbacks.db.gaps import list_gaps

    older = settings.gap_after_s if args.older_than is None else args.older_than
    now = dt.datetime.now(dt.UTC)
    with connect(settings.database_url) as conn:
        gaps = list_gaps(conn, now=now, older_than_s=older, limit=args.limit,
                         endpoint_id=args.endpoint)
    if args.json:
        print_json([{"delivery_id": g.delivery_id, "endpoint_id": g.endpoint_id,
                     "conversion_id": g.conversion_id, "status": g.status,
                     "created_at": g.created_at.isoformat(),
                     "quiet_since": g.quiet_since.isoformat(),
                     "quiet_s": round((now - g.quiet_since).total_seconds())} for g in gaps])
    else:
        print_table(["delivery", "endpoint", "conversion", "status", "quiet since", "quiet"],
                    [[g.delivery_id, g.endpoint_id, g.conversion_id, g.status,
                      iso(int(g.quiet_since.timestamp() * 1000)),
                      f"{(now - g.quiet_since).total_seconds():.0f}s"]
                     for g in gaps])
        print(f"{len(gaps)} gap(s) quiet for more than {older:.0f}s"
              + (f" (first {args.limit})" if len(gaps) == args.limit else ""))
    return 1 if gaps else 0


def _migrate(settings: Settings, _args: argparse.Namespace) -> int:
    from postbacks.db.migrate import migrate

    applied = migrate(settings.database_url)
    print("applied: " + ", ".join(applied) if applied else "database schema is up to date")
    return 0


def _retention(settings: Settings, args: argparse.Namespace) -> int:
    import datetime as dt

    from postbacks.cli_output import print_table
    from postbacks.db.retention import drop_expired

    keep = settings.attempt_retention_days if args.keep_days is None else args.keep_days
    if keep < 2:
        print("postbacks retention: error: --keep-days must be >= 2", file=sys.stderr)
        return 2
    today = dt.datetime.now(dt.UTC).date()
    done = drop_expired(settings.database_url, keep_days=keep, today=today,
                        dry_run=args.dry_run)
    verb = "would drop" if args.dry_run else "dropped"
    if not done:
        print(f"no attempt partition older than {keep} days (none before "
              f"{today - dt.timedelta(days=keep)})")
        return 0
    print_table(("PARTITION", "DAY", "ROWS", "RESULT"),
                [(x.name, x.day, x.rows, verb if x.dropped or args.dry_run else x.error)
                 for x in done])
    dead = sum(x.rows for x in done if x.name == "dead_letters")
    ok = [x for x in done if not x.error and x.name != "dead_letters"]
    failed = len([x for x in done if x.error])
    print(f"{verb} {len(ok)} partition(s), {sum(x.rows for x in ok):,} row(s)"
          + (f"; {'would delete' if args.dry_run else 'deleted'} {dead:,} dead letter(s) "
             f"from before {today - dt.timedelta(days=keep)}" if dead else "")
          + (f"; {failed} left for the next run (lock not granted)" if failed else ""))
    return 1 if failed else 0


def _topics(settings: Settings, args: argparse.Namespace) -> int:
    from topics.admin import create_topics, verify_topics

    if args.action == "create":
        created = create_topics(settings)
        print(f"created {len(created)} topic(s)" + (": " + ", ".join(created) if created else ""))
    drifts = verify_topics(settings)
    for d in drifts:
        print(f"DRIFT {d}", file=sys.stderr)
    if not drifts:
        print("topics match the registry")
    return 1 if drifts else 0


def _seed(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.tools.seed import seed_endpoints

    seeded = seed_endpoints(
        settings, apps=args.apps, endpoints_per_app=args.endpoints_per_app,
        receiver_url=args.receiver_url, namespace=args.namespace, now_ms=int(time.time() * 1000),
    )
    for s in seeded:
        print(f"{s.endpoint_id}\t{s.app_id}\t{s.url}\t{s.secret}")
    return 0


def _emit(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.emit import ConversionProducer, synthetic_conversions
    from postbacks.kafka.clients import check_broker

    check_broker(settings)  # one line naming KAFKA_BOOTSTRAP_SERVERS, not 60 s of retries
    producer = ConversionProducer(settings)
    start = time.monotonic()
    last = start
    events = synthetic_conversions(
        args.count, apps=args.apps, seed=args.seed, namespace=args.namespace,
        now_ms=int(time.time() * 1000),
    )
    for i, event in enumerate(events, 1):
        producer.send(event)
        if args.rate > 0:
            ahead = i / args.rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            print(f"emitted {i}/{args.count}", file=sys.stderr, flush=True)
    left = producer.flush()
    elapsed = time.monotonic() - start
    print(f"emitted {producer.acked} conversion(s) in {elapsed:.1f}s "
          f"({producer.acked / max(elapsed, 1e-9):.0f}/s), unacknowledged {left}, "
          f"failed {len(producer.failed)}")
    return 0 if left == 0 and not producer.failed else 1


def _receiver(_settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.tools.receiver import main as receiver_main

    receiver_main(["--host", args.host, "--port", str(args.port)])
    return 0


def _demo(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.tools.demo import DemoOptions, run_demo

    return run_demo(settings, DemoOptions(
        count=args.count, apps=args.apps, endpoints_per_app=args.endpoints_per_app,
        flaky=args.flaky, dead=args.dead, dead_attempts=args.dead_attempts,
        cohort=args.cohort, replay=args.replay, rate=args.rate, namespace=args.namespace,
        keep_console=args.keep_console, start_services=not args.no_services,
        report_json=args.report_json, timeout_s=args.timeout))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="postbacks",
        description="Kafka pipeline that delivers signed postbacks to ad publishers. "
        "Settings come from the environment (KAFKA_BOOTSTRAP_SERVERS, POSTBACKS_*); "
        "see docs/operators.md.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    for name, help_ in [
        ("fanout", "run the fan-out stage (conversions -> deliveries)"),
        ("gate", "run the gate stage (deliveries -> dispatch | held)"),
        ("agent", "run a delivery agent (dispatch -> HTTP -> attempts, outcomes, retry, dlq)"),
        ("relay", "run the delay relay (retry.*, quarantine -> dispatch when due)"),
        ("sink", "run the PostgreSQL sink (deliveries, attempts, outcomes, dlq -> tables)"),
        ("monitor", "run the monitor (every stage's lag and backlog age, the gap detector, "
         "auto-disable)"),
        ("notifier", "run the notifier (dead letters, breakers, halts -> operations, owners)"),
    ]:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=_stage(name))

    sp = sub.add_parser(
        "gaps", help="list deliveries that have gone quiet (the gap detector)",
        description="List deliveries with no outcome at all, or none since a release or "
        "replay, for longer than --older-than seconds (POSTBACKS_GAP_AFTER_S), quiet "
        "longest first. Failing, quarantined and held deliveries are not gaps (each has "
        "its own alert). Exit 1 when there is any gap.")
    sp.add_argument("--older-than", type=finite(0), default=None, metavar="SECONDS",
                    help="quiet for longer than this (default: POSTBACKS_GAP_AFTER_S)")
    sp.add_argument("--endpoint", default=None, help="only this endpoint id")
    sp.add_argument("--limit", type=whole(1, 100_000), default=100,
                    help="at most this many (default 100)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=_gaps)

    sp = sub.add_parser("migrate", help="apply database migrations", description="Apply "
                        "pending PostgreSQL migrations (idempotent).")
    sp.set_defaults(func=_migrate)

    sp = sub.add_parser(
        "retention", help="drop attempt-log and deliveries partitions older than the "
        "retention window",
        description="Drop the daily delivery_attempts and deliveries partitions whose day is "
        "more than --keep-days (POSTBACKS_ATTEMPT_RETENTION_DAYS) days before today (UTC), "
        "the deliveries' keys, outcome rows and suppressions with them, each in its "
        "own short transaction with an audit row, and the dead letters older than the "
        "window; schedule it daily. Exit 1 when a drop "
        "could not get its lock in time (left for the next run).")
    sp.add_argument("--keep-days", type=whole(2), default=None,
                    help="days of attempts and deliveries to keep (default: "
                    "POSTBACKS_ATTEMPT_RETENTION_DAYS)")
    sp.add_argument("--dry-run", action="store_true", help="list what would be dropped")
    sp.set_defaults(func=_retention)

    sp = sub.add_parser("topics", help="create or verify Kafka topics",
                        description="Create missing topics from the registry, or verify the "
                        "broker matches it (exit 1 on drift).")
    sp.add_argument("action", choices=["create", "verify"])
    sp.set_defaults(func=_topics)

    sp = sub.add_parser("seed", help="seed demo endpoints pointing at a receiver",
                        description="Create endpoints and signing secrets; prints "
                        "endpoint_id, app_id, url, secret per line.")
    sp.add_argument("--apps", type=whole(1), default=5,
                    help="number of apps, app_<namespace>_0001 ... (default 5)")
    sp.add_argument("--endpoints-per-app", type=whole(1), default=2,
                    help="endpoints per app, ep_<namespace>_<app>_<k> (default 2)")
    sp.add_argument("--receiver-url", default="http://127.0.0.1:8787",
                    help="the receiver's base URL; each endpoint posts to "
                    "<url>/hooks/<endpoint id> (default http://127.0.0.1:8787)")
    sp.add_argument("--namespace", default="demo",
                    help="app ids are app_<namespace>_NNNN (default demo)")
    sp.set_defaults(func=_seed)

    sp = sub.add_parser("emit", help="produce synthetic conversions",
                        description="Produce synthetic ConversionEvents to conversions.v1.")
    sp.add_argument("--count", type=whole(1), default=1000,
                    help="conversions to produce (default 1000)")
    sp.add_argument("--rate", type=finite(0), default=0,
                    help="events/s (0 = as fast as possible)")
    sp.add_argument("--seed", type=int, default=1,
                    help="random seed: the same seed and namespace give the same "
                    "conversion ids, apps and payouts (default 1)")
    sp.add_argument("--apps", type=whole(1), default=5,
                    help="spread over this many apps, app_<namespace>_0001 ... (default 5)")
    sp.add_argument("--namespace", default="demo", help="app ids are app_<namespace>_NNNN")
    sp.set_defaults(func=_emit)

    sp = sub.add_parser("receiver", help="run the scriptable local receiver",
                        description="A local postback receiver that verifies signatures.")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=port, default=8787)
    sp.set_defaults(func=_receiver)

    sp = sub.add_parser(
        "demo", help="run the whole pipeline on local services, failures included",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Start Kafka and PostgreSQL (deploy/local/services.sh), migrate, create topics,
start a signature-verifying receiver, every stage and the console, and send
conversions to five groups of endpoints:
  healthy  delivered on the first attempt
  flaky    503 to each delivery's first attempt, then 200: retried through the
           retry topics and the relay, delivered on the second attempt
  dead     always 503: its breaker opens, its last attempts are quarantined,
           every delivery is dead-lettered after --dead-attempts attempts
  cohort   retrodated conversions to an endpoint whose retrodating guard
           enforces: held by the gate, released by a reviewer through the
           console's API, then delivered
  replay   delivered healthy postbacks replayed by support through the
           console's API: they arrive again with their original idempotency keys

The demo's processes run with a shortened schedule (POSTBACKS_RETRY_BASE_S=1,
POSTBACKS_BREAKER_OPEN_S=1, POSTBACKS_BREAKER_RAMP_S=1,
POSTBACKS_BREAKER_FAILURE_THRESHOLD = dead x dead-attempts - 2,
POSTBACKS_CONFIG_REFRESH_S=1, POSTBACKS_ANOMALY_REFRESH_S=0.5) and their own
global anomaly scope (POSTBACKS_ANOMALY_GLOBAL_KEY=demo-<namespace>); the
product's defaults are unchanged. It prints progress while it waits, then one
row per group -- deliveries, attempts, delivered, retried, quarantined,
dead-lettered, held, released, replayed (from PostgreSQL) and the
requests/unique ids the receiver saw -- and where to see each group (console
pages, metrics, SQL).
Exit 1 when a group's counts are not what it should show.""")
    sp.add_argument("--count", type=whole(1), default=2000,
                    help="healthy conversions; each goes to every endpoint of its app "
                    "(default 2000)")
    sp.add_argument("--apps", type=whole(1), default=10, help="healthy apps (default 10)")
    sp.add_argument("--endpoints-per-app", type=whole(1), default=3,
                    help="endpoints per healthy app (default 3)")
    sp.add_argument("--flaky", type=whole(0), default=20,
                    help="deliveries to the flaky endpoint (default 20)")
    sp.add_argument("--dead", type=whole(0), default=10,
                    help="deliveries to the dead endpoint (default 10)")
    sp.add_argument("--dead-attempts", type=whole(0), default=3,
                    help="the dead endpoint's max_attempts, its retry budget (default 3)")
    sp.add_argument("--cohort", type=whole(0), default=25,
                    help="retrodated conversions held then released (default 25)")
    sp.add_argument("--replay", type=whole(0), default=20,
                    help="delivered healthy postbacks replayed through the console "
                    "(default 20)")
    sp.add_argument("--rate", type=finite(0), default=0,
                    help="healthy conversions/s (0 = as fast as possible)")
    sp.add_argument("--namespace", default=None,
                    help="prefix of the demo's app and endpoint ids (default d<unix time>)")
    sp.add_argument("--keep-console", action="store_true",
                    help="after the table, keep the console, the stages and the receiver "
                    "running (prints the console URL and sign-in tokens; Ctrl-C stops them)")
    sp.add_argument("--no-services", action="store_true",
                    help="do not run deploy/local/services.sh up (use the services the "
                    "environment names)")
    sp.add_argument("--report-json", metavar="PATH", default=None,
                    help="also write the table's counts as JSON to PATH")
    sp.add_argument("--timeout", type=finite(1), default=None,
                    help="seconds to wait for every group after the emit "
                    "(default 150 + healthy deliveries / 100)")
    sp.set_defaults(func=_demo)

    from replay_console import cli as console_cli
    from replay_console import deliveries_cli, endpoints_cli, held
    from streams.anomaly_gate import admin as anomaly_admin

    held.add_parser(sub)
    anomaly_admin.add_parser(sub)
    console_cli.add_parser(sub)
    deliveries_cli.add_parser(sub)
    endpoints_cli.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        deny_networks(settings.deny_networks)  # every target check in this process
        code = args.func(settings, args)
    except (ConfigError, ServiceUnavailable, InvalidRecord) as exc:
        print(f"postbacks {args.command}: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
