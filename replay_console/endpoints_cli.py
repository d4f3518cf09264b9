"""``postbacks endpoints create | disabled | enable``: creating an endpoint (the console's
checks, a new signing secret printed once), endpoints the platform disabled, and the
explicit, audited way back (seed 003).

A disabled endpoint's deliveries are parked (held, reason ``endpoint_disabled``; see
:mod:`postbacks.core.endpoint_health`). Re-enabling chooses what happens to them:

- ``deliver``: release the parked backlog (original idempotency keys), after the agents
  have seen the endpoint enabled;
- ``skip``: reject it (never sent, audited per delivery);
- ``keep``: resume from now and leave the backlog parked (release or reject it later
  with ``postbacks held ... --endpoint ID --reason endpoint_disabled``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, cast

from postbacks.cli_args import note
from postbacks.cli_output import fail, iso, print_json, print_table
from postbacks.settings import Settings
from replay_console.held import HeldError, NeedsConfirmation, resolve_held

__all__ = ["BACKLOG_CHOICES", "add_parser"]

BACKLOG_CHOICES = ("deliver", "skip", "keep")
PARKED = "endpoint_disabled"


def _disabled_cmd(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect

    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "SELECT e.endpoint_id, e.app_id, e.disabled_at, e.disabled_reason,"
            " (SELECT count(*) FROM deliveries d WHERE d.endpoint_id = e.endpoint_id"
            "  AND d.status = 'held' AND d.hold_reason = %s)"
            " FROM endpoints e WHERE e.disabled_at IS NOT NULL ORDER BY e.disabled_at",
            (PARKED,)).fetchall()
    found = [{"endpoint_id": ep, "app_id": app, "disabled_at_ms": int(at.timestamp() * 1000),
              "reason": why, "parked": int(n)} for ep, app, at, why, n in rows]
    if args.json:
        print_json(found)
    else:
        print_table(["endpoint", "app", "disabled at", "parked", "reason"],
                    [[f["endpoint_id"], f["app_id"], iso(f["disabled_at_ms"]), f["parked"],
                      f["reason"]] for f in found])
        print(f"{len(found)} disabled endpoint(s)")
    return 0


ENABLE_ROUND = 10_000  # parked deliveries released or rejected per Kafka transaction


def _enable_cmd(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect
    from postbacks.db.endpoint_health import enable
    from postbacks.errors import ServiceUnavailable
    from postbacks.kafka.operations import OperationalEvents
    from replay_console.auth import CLI_PREFIX, name_problem

    problem = name_problem(args.actor, "--actor")
    if problem:
        return fail(args, problem, 2)
    actor = CLI_PREFIX + args.actor.strip()  # never taken for a console user's
    with connect(settings.database_url) as conn:
        app = conn.execute("SELECT app_id FROM endpoints WHERE endpoint_id = %s",
                           (args.endpoint_id,)).fetchone()
        if app is None:
            return fail(args, f"no endpoint {args.endpoint_id}", 2)
        was = enable(conn, args.endpoint_id, actor=actor, backlog=args.backlog, note=args.note)
    if was is None:
        return fail(args, f"{args.endpoint_id} is not disabled; nothing changed", 1)
    print(f"enabled {args.endpoint_id} (it was disabled: {was}) by {actor}")
    try:
        OperationalEvents(settings).publish(
            "endpoint.enabled", args.endpoint_id, str(app[0]), args.note,
            int(time.time() * 1000), actor=actor, detail={"backlog": args.backlog})
    except ServiceUnavailable as exc:  # the change is made and audited; only the event is not
        print(f"postbacks endpoints enable: the endpoint.enabled event was not published: "
              f"{exc}", file=sys.stderr)
    if args.backlog == "keep":
        print("the parked backlog stays held: release or reject it with `postbacks held "
              f"release|reject --endpoint {args.endpoint_id} --reason {PARKED}`")
        return 0
    if args.backlog == "deliver":
        # A release reaching an agent that still sees the endpoint disabled would be parked
        # again: wait until every agent's endpoint view has been refreshed.
        wait = 2 * settings.config_refresh_s
        print(f"waiting {wait:g} s for the agents to see it enabled ...", flush=True)
        time.sleep(wait)
    kind = "released" if args.backlog == "deliver" else "rejected"
    done, skipped, target = 0, 0, ""
    while True:  # in rounds of resolve_held's limit: a backlog has no upper bound
        try:
            r = resolve_held(settings, kind=kind, actor=actor, note=args.note or f"endpoint "
                             f"re-enabled, backlog: {args.backlog}",
                             endpoint=args.endpoint_id, reason=PARKED, yes=True,
                             limit=ENABLE_ROUND)
        except NeedsConfirmation as exc:  # not raised with yes=True; kept for the type
            return fail(args, str(exc), 1)
        except HeldError as exc:
            if not done:
                print(f"parked backlog: {exc}")
            break
        done, skipped, target = done + len(r.delivery_ids), skipped + len(r.skipped), r.target
        if not (r.limit_reached and r.delivery_ids):
            break
        print(f"... {done} {kind} so far", flush=True)
    if done:
        print(f"{kind} {done} parked deliveries"
              + (f" to {target}" if kind == "released" else " (never sent)"))
    return 1 if skipped else 0


def _config_text(arg: str) -> str:
    """``--config``'s JSON: the argument itself, ``@FILE``'s text or, for ``-``, stdin's."""
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        with open(arg[1:], encoding="utf-8") as f:
            return f.read()
    return arg


def _create_cmd(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect
    from replay_console.auth import cli_principal, name_problem
    from replay_console.endpoints import create_endpoint
    from replay_console.guard import json_text
    from replay_console.problem import Problem
    from replay_console.rules import ActionError

    problem = name_problem(args.actor, "--actor")
    if problem:
        return fail(args, problem, 2)
    actor = args.actor.strip()
    try:
        config = json_text(_config_text(args.config), "--config") if args.config else None
    except OSError as exc:
        return fail(args, f"--config: cannot read {args.config[1:]!r}: {exc.strerror}", 2)
    except Problem as exc:
        return fail(args, str(exc), 2)
    if config is not None and not isinstance(config, dict):
        return fail(args, "--config must be a JSON object", 2)
    types = [t for arg in (args.event_types or ["*"]) for t in arg.split(",")]
    with connect(settings.database_url) as conn:
        try:
            problems, created = create_endpoint(
                conn, settings, cli_principal(actor, "admin"), app_id=args.app,
                url=args.url, provider=args.provider, event_types=types, config=config,
                name=args.name or "", note=args.note)
        except ActionError as exc:
            return fail(args, str(exc), 2)
        if created is None:
            for problem in problems:
                print(f"  {problem}", file=sys.stderr)
            return fail(args, "endpoint not created", 1)
        conn.commit()
    if args.json:
        print_json(created)
    else:
        print(f"created {created['endpoint_id']} for {created['app_id']}")
        print(f"signing secret {created['secret_id']} (shown once): {created['secret']}")
        print(f"test it: POST /api/v1/endpoints/{created['endpoint_id']}/test-send")
    return 0


def add_parser(subparsers: Any) -> None:
    """Add ``endpoints`` and its actions to the top-level subparsers."""
    sub = cast(argparse._SubParsersAction, subparsers)  # type: ignore[type-arg]
    p = sub.add_parser(
        "endpoints", help="create endpoints; endpoints the platform disabled, re-enabling them",
        description="An endpoint that has only failed for POSTBACKS_AUTO_DISABLE_AFTER_S "
        "(72 h), or answered 410 Gone with disable_on_gone in its config, is disabled by "
        "`postbacks monitor`; its deliveries are parked (held, reason endpoint_disabled), "
        "never dropped.")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser(
        "create", help="create an endpoint (audited; prints its signing secret once)",
        description="Create an endpoint with the console's checks (URL and its addresses, "
        "provider, config and macros, event types, a dry render) and a new signing secret, "
        "printed once. Exit 1 with the problems when it is refused.")
    sp.add_argument("--app", required=True, help="the publisher app's id")
    sp.add_argument("--url", required=True, help="where postbacks are sent (http or https)")
    sp.add_argument("--provider", default="v3", help="payload provider (default v3)")
    sp.add_argument("--event-type", dest="event_types", action="append", metavar="TYPE",
                    help="an event type it is sent (repeat, or comma separated; default *)")
    sp.add_argument("--config", help="endpoint config as a JSON object, @FILE to read it "
                    "from a file or - from standard input (keeps custom header values, "
                    "credentials, out of the command line and the shell's history)")
    sp.add_argument("--name", help="a display name")
    sp.add_argument("--actor", required=True, help="who you are (audited)")
    sp.add_argument("--note", type=note, help="why (audited)")
    sp.add_argument("--json", action="store_true",
                    help="print JSON: endpoint_id, app_id, secret_id, secret")
    sp.set_defaults(func=_create_cmd)
    sp = actions.add_parser("disabled", help="list disabled endpoints",
                            description="Disabled endpoints, oldest first, with their "
                            "parked deliveries.")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=_disabled_cmd)
    sp = actions.add_parser(
        "enable", help="re-enable a disabled endpoint (audited)",
        description="Re-enable a disabled endpoint, audited, and choose what happens to "
        "its parked deliveries: deliver them (original idempotency keys), skip them "
        "(rejected, never sent), or keep them parked and resume from now. Exit 1 when "
        "the endpoint is not disabled.")
    sp.add_argument("endpoint_id", help="the endpoint's id (ep_...)")
    sp.add_argument("--backlog", required=True, choices=BACKLOG_CHOICES,
                    help="what to do with its parked deliveries")
    sp.add_argument("--actor", required=True, help="who you are (audited)")
    sp.add_argument("--note", type=note, help="why (audited)")
    sp.set_defaults(func=_enable_cmd)
