"""``postbacks console serve | token create | list | revoke``: the replay console's server
and its sign-in tokens. The console's views and replays from the command line are
``postbacks deliveries`` (:mod:`.deliveries_cli`); release and reject are ``postbacks held``.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, cast

from postbacks.cli_args import note, port
from postbacks.cli_output import fail, print_json, print_table
from postbacks.settings import Settings

__all__ = ["add_parser"]


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.migrate import pending_migrations
    from replay_console.web import serve

    pending = pending_migrations(settings.database_url)
    if pending:
        return fail(args, f"database schema is behind ({', '.join(pending)}): run "
                    "postbacks migrate", 2)
    try:
        serve(settings, host=args.host, port=args.port, drain=not args.no_drain)
    except OSError as exc:  # the address: in use, not this host's, or no such host
        where = f"{args.host or settings.console_host}:" \
            f"{settings.console_port if args.port is None else args.port}"
        return fail(args, f"cannot serve on {where}: {exc.strerror or exc}", 2)
    return 0


# A new token's lifetime unless --expires-in says otherwise.
DEFAULT_EXPIRES_IN = "90d"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float | None:
    """``30d``, ``12h``, ``45m``, ``90s``, ``2w`` as seconds; ``never`` as None. Raises
    ValueError."""
    t = text.strip().lower()
    if t == "never":
        return None
    m = re.fullmatch(r"([0-9]{1,6})([smhdw])", t)
    if m is None or int(m.group(1)) == 0:
        raise ValueError(f"--expires-in {text!r}: give a number and a unit (s, m, h, d, w), "
                         "e.g. 30d or 12h, or never")
    return float(int(m.group(1)) * _UNITS[m.group(2)])


def _by(args: argparse.Namespace, what: str) -> str:
    """The audit actor of a token command: ``cli:<by>`` (so never taken for a console
    token's name), after the check every actor gets. Without ``--by`` it is the login
    name of the account running the command, and ``cli`` only when there is none."""
    from replay_console.auth import CLI_PREFIX, name_problem

    by: str | None = args.by
    if by is None:
        login = _login_name()
        return ("cli" if login is None or name_problem(login, "")
                else CLI_PREFIX + login.strip())
    problem = name_problem(by, f"--by (who {what} it)")
    if problem:
        raise ValueError(problem)
    return CLI_PREFIX + by.strip()


def _login_name() -> str | None:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no LOGNAME/USER and no passwd entry
        return None


def _token(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect
    from replay_console.auth import create_token

    try:
        by = _by(args, "issues")
        expires_in_s = parse_duration(args.expires_in)
    except ValueError as exc:
        return fail(args, str(exc), 2)
    with connect(settings.database_url) as conn:
        try:
            token_id, token = create_token(conn, name=args.name, role=args.role,
                                           app_ids=args.apps or (), created_by=by,
                                           expires_in_s=expires_in_s)
        except ValueError as exc:
            return fail(args, str(exc), 2)
        expires = conn.execute("SELECT expires_at FROM console_tokens WHERE token_id = %s",
                               (token_id,)).fetchone()
        conn.commit()
    expires_at = expires[0] if expires else None
    if args.json:
        print_json({"token_id": token_id, "token": token, "name": args.name, "role": args.role,
                    "expires_at": expires_at.isoformat() if expires_at else None})
    else:
        print(f"{token_id}\t{args.role}\t{args.name}\n{token}")
        print("(the token is shown once; it signs in to the console and the API; "
              + (f"it expires {expires_at.isoformat(timespec='seconds')})" if expires_at
                 else "it does not expire)"), file=sys.stderr)
    return 0


def _when(v: Any) -> str:
    return v.isoformat(timespec="seconds") if v is not None else ""


def _token_list(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect
    from replay_console.auth import list_tokens

    with connect(settings.database_url) as conn:
        rows = list_tokens(conn)
    if not args.all:
        rows = [r for r in rows if r["state"] == "active"]
    if args.json:
        print_json({"tokens": [{k: (_when(v) or None) if k.endswith("_at") else v
                                for k, v in r.items()} for r in rows]})
        return 0
    print_table(["TOKEN", "NAME", "ROLE", "SCOPE", "CREATED", "EXPIRES", "LAST USED", "STATE"],
                [[r["token_id"], r["name"], r["role"], ",".join(r["app_ids"]) or "staff",
                  _when(r["created_at"]), _when(r["expires_at"]) or "never",
                  _when(r["last_used_at"]) or "never",
                  r["state"] + (f" {_when(r['revoked_at'])}" if r["revoked_at"] else "")]
                 for r in rows])
    return 0


def _token_revoke(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.connect import connect
    from replay_console.auth import revoke_token

    try:
        by = _by(args, "revokes")
    except ValueError as exc:
        return fail(args, str(exc), 2)
    with connect(settings.database_url) as conn:
        ok = revoke_token(conn, args.token_id, by=by, note=args.note)
        conn.commit()
    if not ok:
        return fail(args, f"no token {args.token_id!r}, or it is already revoked", 1)
    if args.json:
        print_json({"revoked": args.token_id})
    else:
        print(f"revoked {args.token_id} (its sessions end at their next request)")
    return 0


def add_parser(subparsers: Any) -> None:
    sub = cast(argparse._SubParsersAction, subparsers)  # type: ignore[type-arg]
    p = sub.add_parser("console", help="run the replay console; issue sign-in tokens",
                       description="The replay console: web pages and a JSON API over "
                       "PostgreSQL that re-drive deliveries through the retry topics.")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser("serve", help="serve the console (and drain queued replays)",
                            description="Serve the console on POSTBACKS_CONSOLE_HOST:PORT "
                            "(default 127.0.0.1:8790) with the replay drainer in a thread.")
    sp.add_argument("--host", help="listen address (default POSTBACKS_CONSOLE_HOST)")
    sp.add_argument("--port", type=port, help="port (default POSTBACKS_CONSOLE_PORT)")
    sp.add_argument("--no-drain", action="store_true",
                    help="do not publish queued replays from this process")
    sp.set_defaults(func=_serve)
    tp = actions.add_parser("token", help="issue sign-in tokens",
                            description="Console sign-in tokens (shown once).")
    tacts = tp.add_subparsers(dest="token_action", required=True, metavar="ACTION")
    sp = tacts.add_parser("create", help="create a token",
                          description="Create a token for a person or a publisher.")
    sp.add_argument("--name", required=True, help="who signs in with it (the audit actor)")
    sp.add_argument("--role", required=True,
                    choices=["support", "reviewer", "admin", "publisher"],
                    help="what the token may do: support (find, inspect, replay, suppress, "
                    "test-send), reviewer (also release or reject held deliveries, import), "
                    "admin (everything, endpoint config and secrets included), publisher "
                    "(read its apps' deliveries; needs --app)")
    sp.add_argument("--app", dest="apps", action="append", metavar="APP_ID",
                    help="a publisher's app (repeat); required for publishers")
    sp.add_argument("--by", help="who issues it (audited as cli:<by>; default: your login name)")
    sp.add_argument("--expires-in", default=DEFAULT_EXPIRES_IN, metavar="DURATION",
                    help="lifetime: 30d, 12h, 45m, 2w, or never "
                    f"(default {DEFAULT_EXPIRES_IN})")
    sp.add_argument("--json", action="store_true",
                    help="print JSON: token_id, token, name, role, expires_at")
    sp.set_defaults(func=_token)
    sp = tacts.add_parser("list", help="list tokens (never their secrets)",
                          description="Active tokens: id, name, role, scope, created, "
                          "expires, last used (to the minute) and state.")
    sp.add_argument("--all", action="store_true", help="expired and revoked ones too")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=_token_list)
    sp = tacts.add_parser("revoke", help="revoke a token (audited)",
                          description="Revoke a token: it signs nothing in from now on and "
                          "its sessions end at their next request.")
    sp.add_argument("token_id", metavar="ID", help="the token id (tok_..., see token list)")
    sp.add_argument("--by", help="who revokes it (audited as cli:<by>; default: your login name)")
    sp.add_argument("--note", type=note, help="why (audited)")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp.set_defaults(func=_token_revoke)
