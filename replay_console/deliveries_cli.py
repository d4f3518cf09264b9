"""``postbacks deliveries list | show | replay | rerender | import``: the console's delivery
views, replay and backfill import from the command line (release and reject are
``postbacks held release | reject``).

The CLI runs the same queries and actions as the web console, as a staff principal named
by ``--actor`` (with ``--role``, default support; the console's rate limit and bulk
confirmation apply the same way). A replay is queued, then drained here at the
per-endpoint cap with progress on stderr — or, when a console server is draining, waited
for (``--no-wait`` returns at once).
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any, cast

from postbacks.cli_args import note, whole
from postbacks.cli_output import fail, iso, print_json, print_table, shown, usd
from postbacks.settings import Settings

__all__ = ["add_parser"]


def _principal(args: argparse.Namespace) -> Any:
    from replay_console.auth import cli_principal

    return cli_principal("cli" if args.actor is None else args.actor, args.role)


def _actor_problem(args: argparse.Namespace, *, writes: bool = True) -> str | None:
    """What is wrong with ``--actor``: a command that changes anything names a person (a
    replay as ``admin:cli:cli`` said who did it to nobody)."""
    from replay_console.auth import name_problem

    if writes and args.actor is None:
        return ("--actor NAME is required: who you are, written to the audit log with "
                "what this command changes")
    return name_problem("cli" if args.actor is None else args.actor, "--actor")


_FILTER_ARGS = ("q", "app", "endpoint", "status", "error", "error_class", "since", "until",
                "created_from", "created_to")


def _filter(args: argparse.Namespace) -> Any:
    from replay_console.queries import parse_filter

    params = {k: str(getattr(args, k)) for k in (*_FILTER_ARGS, "cursor", "limit")
              if getattr(args, k, None) not in (None, "")}
    return parse_filter(params)


def _list(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect
    from replay_console.queries import FilterError, list_deliveries

    try:
        flt = _filter(args)
    except FilterError as exc:
        return fail(args, str(exc), 2)
    with connect(settings.database_url) as conn:
        rows, nxt = list_deliveries(conn, _principal(args), flt)
    if args.json:
        print_json({"deliveries": rows, "next_cursor": nxt})
        return 0
    print_table(["DELIVERY", "ENDPOINT", "APP", "STATUS", "ATTEMPTS", "LAST ERROR", "PAYOUT",
                 "CREATED"],
                [[r["delivery_id"], r["endpoint_id"], r["app_id"], r["status"],
                  r["attempt_count"], r["last_error"] or "", usd(r["payout_usd_micros"]),
                  iso(r["created_at_ms"])] for r in rows])
    if nxt:
        print(f"\nmore: --cursor {nxt}")
    return 0


def _show(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect
    from replay_console.queries import NotFound, delivery_detail

    with connect(settings.database_url) as conn:
        try:
            d = delivery_detail(conn, _principal(args), args.delivery_id)
        except NotFound as exc:
            return fail(args, str(exc), 1)
    if args.json:
        print_json(d)
        return 0
    # Every value may come from outside (a producer, a receiver): shown() escapes what a
    # terminal would act on.
    print(shown(f"{d['delivery_id']}  {d['status']}  endpoint {d['endpoint_id']}  "
                f"app {d['app_id']}", lines=False))
    print(shown(f"idempotency key {d['idempotency_key']}  attempts {d['attempt_count']}  "
                f"payout {usd(d['payout_usd_micros'])}  created {iso(d['created_at_ms'])}",
                lines=False))
    if d.get("hold_reason"):
        print(shown(f"held: {d['hold_reason']} since {iso(d.get('held_at_ms'))}", lines=False))
    for a in d["attempts"]:
        print("\n" + shown(f"#{a['attempt_no']} {a['trigger']} {a['result']} "
                           f"{a['status_code'] or ''} {iso(a['attempted_at_ms'])}"
                           f"{' ' + (a['error_class'] or '') if a['error_class'] else ''}",
                           lines=False))
        print(shown(f"  > {a['request_method']} {a['request_url']}", lines=False))
        for k, v in sorted(a["request_headers"].items()):
            print(shown(f"  > {k}: {v}", lines=False))
        if a["request_body"]:
            print(f"  > {shown(a['request_body'])}")
        if a["response_excerpt"]:
            print(f"  < {shown(a['response_excerpt'])}")
    print("\noutcomes: " + ", ".join(f"{o['kind']}@{iso(o['occurred_at_ms'])}"
                                      for o in d["outcomes"]))
    return 0


def _replay(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.core.override import OverrideError, parse_override
    from postbacks.db.connect import connect
    from replay_console.actions import create_replay
    from replay_console.drain import wait_for_job
    from replay_console.guard import json_text
    from replay_console.problem import Problem
    from replay_console.queries import FilterError
    from replay_console.rules import ActionError

    problem = _actor_problem(args)
    if problem:
        return fail(args, problem, 2)
    has_filter = any(getattr(args, k, None) for k in _FILTER_ARGS)
    if bool(args.delivery_ids) == has_filter:
        return fail(args, "give delivery ids or filters (--app/--endpoint/--status/--error/"
                    "--since/--until), not both and not neither", 2)
    try:
        flt = _filter(args) if has_filter else None
        raw: dict[str, Any] = {}
        if args.url:
            raw["url"] = args.url
        if args.fields:
            raw["fields"] = [f.strip() for f in args.fields.split(",") if f.strip()]
        if args.aliases:
            try:
                raw["aliases"] = json_text(args.aliases, "--aliases")
            except Problem as exc:
                raise OverrideError(f"{exc}; e.g. " '{"payout":"amount"}') from None
        override = parse_override(raw) if raw else None
    except (FilterError, OverrideError, ValueError) as exc:
        return fail(args, str(exc), 2)
    with connect(settings.database_url) as conn:
        try:
            job = create_replay(conn, settings, _principal(args),
                                delivery_ids=args.delivery_ids or (), flt=flt,
                                override=override, note=args.note,
                                confirm=args.confirm if not args.yes else None)
        except ActionError as exc:
            needs = exc.extra.get("needs_confirmation")
            if needs is not None and args.yes:
                try:
                    job = create_replay(conn, settings, _principal(args),
                                        delivery_ids=args.delivery_ids or (), flt=flt,
                                        override=override, note=args.note,
                                        confirm=int(needs))
                except ActionError as again:
                    return fail(args, str(again), 1)
            else:
                hint = f" (re-run with --confirm {needs})" if needs is not None else ""
                return fail(args, f"{exc}{hint}", 1 if exc.status != 400 else 2)
        conn.commit()
    for what, before, after in job.diff:
        print(shown(f"  {what}: {before} -> {after}", lines=False), file=sys.stderr)
    skipped = ", ".join(f"{n} {s}" for s, n in sorted(job.skipped.items()))
    print(f"queued replay {job.job_id}: {job.total} deliveries"
          + (f" (not replayable, left out: {skipped})" if skipped else ""), file=sys.stderr)
    if args.no_wait:
        print(job.job_id)
        return 0

    def progress(status: dict[str, Any]) -> None:
        print(f"  published {status['published']}/{status['total']}", file=sys.stderr,
              flush=True)

    status = wait_for_job(settings, job.job_id, threading.Event(), progress=progress)
    print(f"{job.job_id}\t{status['published']}/{status['total']} published\t{status['state']}")
    return 0 if status["state"] == "done" else 1


def _rerender(settings: Settings, args: argparse.Namespace) -> int:
    """Preview an endpoint's re-render (each delivery rendered with the current config);
    with --yes, queue it as a bulk replay of the previewed count and drain it."""
    from postbacks.db.connect import connect
    from replay_console.drain import wait_for_job
    from replay_console.queries import NotFound
    from replay_console.rerender import rerender_preview, rerender_replay
    from replay_console.rules import ActionError

    problem = _actor_problem(args, writes=args.yes)
    if problem:
        return fail(args, problem, 2)
    p = _principal(args)
    with connect(settings.database_url) as conn:
        try:
            pv = rerender_preview(conn, settings, p, args.endpoint)
        except NotFound as exc:
            return fail(args, str(exc), 1)
        except ActionError as exc:
            return fail(args, str(exc), 1)
        conn.rollback()
        if args.json:
            print_json(pv)
        else:
            for x in pv["deliveries"]:
                first = (f"{x['request']['method']} {x['request']['url']}" if x["renders"]
                         else f"still fails: {x['error']}")
                print("\t".join(shown(v, lines=False)
                                for v in (x["delivery_id"], x["status"], first)))
            skipped = ", ".join(f"{n} {s}" for s, n in sorted(pv["skipped"].items()))
            print(f"{pv['replayable']} to re-render: {pv['renders']} render now, "
                  f"{pv['still_failing']} still fail"
                  + (f" (left out: {skipped})" if skipped else ""), file=sys.stderr)
        if not args.yes:
            if pv["replayable"]:
                print("re-run with --yes to replay them", file=sys.stderr)
            return 0
        try:
            job = rerender_replay(conn, settings, p, args.endpoint, confirm=pv["replayable"],
                                  note=args.note)
        except ActionError as exc:
            return fail(args, str(exc), 1 if exc.status != 400 else 2)
        conn.commit()
    print(f"queued re-render {job.job_id}: {job.total} deliveries", file=sys.stderr)
    if args.no_wait:
        print(job.job_id)
        return 0
    status = wait_for_job(settings, job.job_id, threading.Event())
    print(f"{job.job_id}\t{status['published']}/{status['total']} published\t{status['state']}")
    return 0 if status["state"] == "done" else 1


def _import(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.core.backfill import sniff_format
    from postbacks.db.connect import connect
    from replay_console.backfill import import_deliveries
    from replay_console.rules import ActionError

    problem = _actor_problem(args, writes=not args.dry_run)
    if problem:
        return fail(args, problem, 2)
    try:
        with open(args.file, encoding="utf-8", errors="surrogateescape", newline="") as f:
            text = f.read()
    except OSError as exc:
        return fail(args, f"cannot read {args.file}: {exc.strerror or exc}", 2)
    fmt = args.format or sniff_format(args.file, text[:200])

    def progress(n: int) -> None:
        print(f"... {n} lines checked", file=sys.stderr)

    with connect(settings.database_url) as conn:
        try:
            report = import_deliveries(conn, settings, _principal(args), text, fmt=fmt,
                                       dry_run=args.dry_run, source=args.file,
                                       progress=progress)
        except ActionError as exc:
            return fail(args, str(exc), 1)
        conn.commit()
    out = report.as_dict()
    if args.json:
        print_json(out)
    else:
        print_table(["LINE", "RESULT", "LEGACY ID", "DELIVERY", "RENDERS", "MESSAGE"],
                    [[x["line"], x["result"], x.get("legacy_id") or "",
                      x.get("delivery_id") or "",
                      {True: "yes", False: "no", None: ""}[x.get("renders")],
                      x.get("message") or x.get("render_error") or ""]
                     for x in out["lines"] if args.all or x["result"] not in (
                         "imported", "would_import") or x.get("renders") is False])
    counts = ", ".join(f"{n} {k}" for k, n in out["counts"].items()) or "no lines"
    verb = "dry run (nothing written)" if args.dry_run else "imported"
    print(f"{verb}: {counts}; {out['not_rendering']} do not render with the endpoint's "
          "current config", file=sys.stderr)
    return 1 if out["counts"].get("invalid") else 0


def add_parser(subparsers: Any) -> None:
    """Add ``deliveries`` and its actions to the top-level subparsers."""
    sub = cast(argparse._SubParsersAction, subparsers)  # type: ignore[type-arg]
    p = sub.add_parser("deliveries", help="find, inspect and replay deliveries",
                       description="The console's delivery views and replay from the "
                       "command line (release/reject: postbacks held).")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--actor", help="who you are (audited; required to replay, "
                        "re-render with --yes or import without --dry-run)")
    common.add_argument("--role", default="support", choices=["support", "reviewer", "admin"],
                        help="act with this staff role's rights (default support)")
    sp = acts.add_parser("list", parents=[common], help="list deliveries, newest first",
                         description="Deliveries matching every filter, newest first.")
    _filters(sp)
    sp.add_argument("--cursor", help="the 'more' cursor of the previous page")
    sp.add_argument("--limit", type=whole(1, 200), default=50, help="rows per page (1-200)")
    sp.add_argument("--json", action="store_true",
                    help="print JSON: the page's deliveries and next_cursor")
    sp.set_defaults(func=_list)
    sp = acts.add_parser("show", parents=[common], help="one delivery with every attempt",
                         description="A delivery, its attempts (exact request and response "
                         "excerpt), outcomes and audit trail.")
    sp.add_argument("delivery_id")
    sp.add_argument("--json", action="store_true",
                    help="print JSON: the delivery with its attempts, outcomes, dead letters "
                    "and audit trail")
    sp.set_defaults(func=_show)
    sp = acts.add_parser(
        "replay", parents=[common], help="re-drive deliveries (original idempotency key)",
        description="Queue a replay of the given deliveries, or of every delivery matching "
        "the filters (bulk), then publish it at the per-endpoint cap. --url/--fields/"
        "--aliases edit this re-drive only (SSRF-checked).")
    sp.add_argument("delivery_ids", nargs="*", metavar="DELIVERY_ID")
    _filters(sp)
    sp.add_argument("--url", help="edit: send this re-drive to this URL")
    sp.add_argument("--fields", help="edit: V3 field subset, comma separated")
    sp.add_argument("--aliases", help='edit: V3 key aliases as JSON, e.g. {"payout":"amount"}')
    sp.add_argument("--note", type=note, help="why (audited)")
    sp.add_argument("--confirm", type=whole(0), help="bulk: the number of deliveries you expect")
    sp.add_argument("--yes", action="store_true", help="bulk: confirm whatever matches")
    sp.add_argument("--no-wait", action="store_true", help="queue it and return")
    sp.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    sp.set_defaults(func=_replay)
    sp = acts.add_parser(
        "rerender", parents=[common], help="re-render an endpoint's undelivered deliveries",
        description="Render the endpoint's exhausted, dead-lettered and render-failed "
        "deliveries with its current config (a preview: nothing sent), then, with --yes, "
        "replay them as a bulk replay of the previewed count (capped and audited).")
    sp.add_argument("--endpoint", required=True, help="endpoint id")
    sp.add_argument("--note", type=note, help="why (audited)")
    sp.add_argument("--yes", action="store_true", help="replay what the preview shows")
    sp.add_argument("--no-wait", action="store_true", help="queue it and return")
    sp.add_argument("--json", action="store_true", help="the preview as JSON")
    sp.set_defaults(func=_rerender)
    sp = acts.add_parser(
        "import", parents=[common], help="import legacy failed deliveries (CSV or JSONL)",
        description="Import legacy failed deliveries as dead-lettered deliveries that can be "
        "replayed (docs/backfill.md has the columns). Every line gets a verdict: imported, "
        "exists (already there: re-runs create nothing new), duplicate, or invalid with the "
        "reason; each is also rendered with the endpoint's current config. Exit 1 when a "
        "line is invalid (the valid ones are imported). Needs the reviewer or admin role.")
    sp.add_argument("file", help="a .csv (header row) or .jsonl file")
    sp.add_argument("--format", choices=["csv", "jsonl"],
                    help="the file's format (default: from the extension or the content)")
    sp.add_argument("--dry-run", action="store_true",
                    help="validate and report every line; write nothing")
    sp.add_argument("--all", action="store_true",
                    help="list every line (default: only those needing attention)")
    sp.add_argument("--json", action="store_true", help="the whole report as JSON")
    sp.set_defaults(func=_import)


def _filters(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--app", help="app id")
    sp.add_argument("--endpoint", help="endpoint id")
    sp.add_argument("--status", help="delivery status (delivered, exhausted: retries ran "
                    "out, dead_lettered: failed permanently, ...)")
    sp.add_argument("--error", help="error class of the last attempt: exact (http_503, "
                    "timeout) or an HTTP status family (http_5xx: every http_5NN)")
    sp.add_argument("--since", help="created at or after (2026-11-30 or an ISO time)")
    sp.add_argument("--until", help="created before")
    sp.add_argument("--search", dest="q", metavar="ID",
                    help="one delivery by any of its ids, exact: delivery id, conversion id, "
                    "idempotency key or webhook-id")
    sp.add_argument("--error-class", dest="error_class",
                    help="error class of the last attempt (same as --error)")
    sp.add_argument("--from", dest="created_from",
                    help="created at or after (2026-11-30 or an ISO time with offset)")
    sp.add_argument("--to", dest="created_to",
                    help="created up to (a date includes that whole day; a time is exclusive)")
