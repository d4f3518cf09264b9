"""``postbacks held list | release | reject``: the cohorts the anomaly gate held.

Release re-drives each held delivery with its original ``delivery_id`` and idempotency key
(``trigger="release"``, ``triggered_by`` = the actor, ``due_at`` = now) onto the first retry
tier; the relay forwards it to dispatch (it does not pass the gate again). Reject resolves a
delivery as never sent. Each command publishes its records (retry + ``released`` outcomes,
or ``rejected`` outcomes) in ONE Kafka transaction, then commits one audit row per delivery;
the sink projects the outcomes into ``deliveries.status``. Resolutions are serialised, and
a delivery already resolved is never resolved again.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from postbacks.records import DeliveryRecord
from postbacks.settings import Settings
from postbacks.tools.cli_output import fail, iso, print_json, print_table, usd

if TYPE_CHECKING:
    from postbacks.db.anomaly import HeldDelivery

__all__ = [
    "CONFIRM_ABOVE",
    "RELEASE_TIER",
    "add_parser",
    "list_cmd",
    "reject_cmd",
    "release_cmd",
    "released_record",
]

CONFIRM_ABOVE = 100  # resolving more deliveries than this needs --yes
RELEASE_TIER = "5s"  # the first retry tier
_STAGE = "held-cli"


def released_record(h: HeldDelivery, *, actor: str, now_ms: int,
                    trigger: str = "release") -> DeliveryRecord:
    """The held delivery as it is re-driven, checked against the Delivery schema (a
    ValueError names the delivery when its stored snapshot is not a valid record)."""
    from postbacks.codec import codec_for
    from postbacks.errors import UndecodableRecord

    d: dict[str, Any] = {
        "delivery_id": h.delivery_id, "endpoint_id": h.endpoint_id,
        "idempotency_key": h.idempotency_key, "conversion": h.snapshot,
        "created_at": h.created_at_ms, "attempt": h.attempt_count, "trigger": trigger,
        "triggered_by": actor, "due_at": now_ms, "enqueued_at": None,
        "first_attempt_at": None, "hold_reason": None, "last_error": None,
    }
    codec = codec_for("Delivery")
    try:
        return cast(DeliveryRecord, codec.decode(codec.encode(d)))
    except (ValueError, UndecodableRecord) as exc:
        raise ValueError(f"{h.delivery_id}: stored snapshot is not a valid delivery: {exc}"
                         ) from exc


def list_cmd(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.anomaly import held_deliveries
    from postbacks.db.connect import connect

    with connect(settings.database_url) as conn:
        held = held_deliveries(conn, endpoint_id=args.endpoint, reason=args.reason,
                               app_id=args.app, limit=args.limit)
    if args.json:
        print_json([{
            "delivery_id": h.delivery_id, "endpoint_id": h.endpoint_id, "app_id": h.app_id,
            "idempotency_key": h.idempotency_key, "hold_reason": h.hold_reason,
            "held_at_ms": h.held_at_ms, "payout_usd_micros": h.payout_usd_micros,
            "attempt_count": h.attempt_count, "created_at_ms": h.created_at_ms,
            "snapshot": h.snapshot,
        } for h in held])
        return 0
    print_table(
        ["DELIVERY", "ENDPOINT", "APP", "REASON", "HELD AT", "PAYOUT", "ATTEMPTS"],
        [[h.delivery_id, h.endpoint_id, h.app_id, h.hold_reason, iso(h.held_at_ms),
          usd(h.payout_usd_micros), h.attempt_count] for h in held],
    )
    total = sum(h.payout_usd_micros or 0 for h in held)
    more = f" (limit {args.limit} reached: more may be held)" if len(held) >= args.limit else ""
    print(f"\n{len(held)} held, payout {usd(total)}{more}")
    return 0


def _selection(args: argparse.Namespace) -> str | None:
    """An error message when the selection is missing or ambiguous."""
    filters = [args.endpoint, args.reason, args.app]
    if args.delivery_ids and (args.all or any(f is not None for f in filters)):
        return "--delivery-id cannot be combined with --all, --endpoint, --reason or --app"
    if args.all and any(f is not None for f in filters):
        return "--all cannot be combined with --endpoint, --reason or --app"
    if not (args.delivery_ids or args.all or any(f is not None for f in filters)):
        return "choose what to resolve: --delivery-id ID..., --endpoint/--reason/--app, or --all"
    if not args.actor.strip():
        return "--actor must name who you are"
    return None


def _resolve(settings: Settings, args: argparse.Namespace, kind: str) -> int:
    from postbacks.codec import codec_for
    from postbacks.core.outcomes import make_outcome
    from postbacks.db.anomaly import audit_held, held_deliveries, lock_held
    from postbacks.db.connect import connect
    from postbacks.kafka.publish import publish_transaction
    from postbacks.topics import TOPICS

    problem = _selection(args)
    if problem:
        return fail(args, problem, 2)
    actor, note = args.actor.strip(), args.note
    release = kind == "released"
    verb = "release" if release else "reject"
    now_ms = int(time.time() * 1000)
    ids: list[str] = list(dict.fromkeys(args.delivery_ids or []))
    with connect(settings.database_url) as conn, conn.transaction():
        lock_held(conn)  # until commit: a concurrent release/reject waits, then skips these
        held = held_deliveries(
            conn, endpoint_id=args.endpoint, reason=args.reason, app_id=args.app,
            delivery_ids=ids or None, limit=max(args.limit, len(ids)),
        )
        if ids:
            missing = [i for i in ids if i not in {h.delivery_id for h in held}]
            if missing:
                return fail(args, f"not held (unknown, never held, or already resolved): "
                            f"{', '.join(missing)}; nothing was {kind}", 1)
        if not held:
            return fail(args, f"no held deliveries match; nothing was {kind}", 1)
        if len(held) > CONFIRM_ABOVE and not args.yes:
            print(f"{len(held)} held deliveries would be {kind}"
                  f"{' (limit reached: more match)' if len(held) >= args.limit else ''}; "
                  f"re-run with --yes to {verb} them", file=sys.stderr)
            return 1
        ok: list[HeldDelivery] = []
        items: list[tuple[str, bytes | None, bytes]] = []
        errors = 0
        outcomes = settings.topic(TOPICS.outcomes.base)
        retry = settings.topic(TOPICS.retry_tier(RELEASE_TIER).base)
        for h in held:
            try:
                d = released_record(h, actor=actor, now_ms=now_ms,
                                    trigger="release" if release else "reject")
            except ValueError as exc:
                errors += 1
                print(f"postbacks held {verb}: skipped {exc}", file=sys.stderr)
                continue
            key = h.endpoint_id.encode()
            reason = f"{kind} by {actor}" + (f": {note}" if note else "")
            if release:
                items.append((retry, key, codec_for("Delivery").encode(d)))
            outcome = make_outcome(d, kind, now_ms=now_ms, actor=actor, reason=reason)
            items.append((outcomes, key, codec_for("Outcome").encode(outcome)))
            ok.append(h)
        if ok:
            publish_transaction(settings, _STAGE, items)
            after = ({"status": "released", "triggered_by": actor} if release
                     else {"status": "rejected", "reason": f"rejected by {actor}"
                           + (f": {note}" if note else "")})
            audit_held(conn, ok, action=f"held.{verb}", actor=actor, after=after, note=note)
    where = f" to {retry}" if release else " (never sent)"
    print(f"{kind} {len(ok)} held deliveries{where} by {actor}"
          + (f"; {errors} skipped (see above)" if errors else ""))
    if len(held) >= args.limit:
        print(f"limit {args.limit} reached: more may be held; run again", file=sys.stderr)
    return 1 if errors else 0


def release_cmd(settings: Settings, args: argparse.Namespace) -> int:
    return _resolve(settings, args, "released")


def reject_cmd(settings: Settings, args: argparse.Namespace) -> int:
    return _resolve(settings, args, "rejected")


def add_parser(subparsers: Any) -> None:
    """Add ``held`` and its actions to the top-level subparsers."""
    sub = cast(argparse._SubParsersAction, subparsers)  # type: ignore[type-arg]
    p = sub.add_parser(
        "held", help="list, release or reject held deliveries",
        description="Deliveries the anomaly gate held (deliveries.status = 'held'). "
        "Release re-drives them with their original idempotency key; reject resolves "
        "them as never sent. Both are audited.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser("list", help="list held deliveries",
                            description="Held deliveries, oldest hold first.")
    _filters(sp)
    sp.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    sp.add_argument("--json", action="store_true", help="JSON (with snapshots) instead of a table")
    sp.set_defaults(func=list_cmd)
    for name, func, what in [
        ("release", release_cmd, "re-drive them (original key, trigger release) through the "
         "first retry tier, with a released outcome"),
        ("reject", reject_cmd, "resolve them as never sent, with a rejected outcome"),
    ]:
        sp = actions.add_parser(
            name, help=f"{name} held deliveries",
            description=f"Select held deliveries and {what}; one Kafka transaction, one "
            f"audit row per delivery. More than {CONFIRM_ABOVE} need --yes.",
        )
        sp.add_argument("--delivery-id", dest="delivery_ids", nargs="+", action="extend",
                        metavar="ID", help="these deliveries (all must be held)")
        _filters(sp)
        sp.add_argument("--all", action="store_true", help="every held delivery")
        sp.add_argument("--actor", required=True, help="who you are (audited)")
        sp.add_argument("--note", help="why (audited, and in the outcome's reason)")
        sp.add_argument("--yes", action="store_true",
                        help=f"confirm resolving more than {CONFIRM_ABOVE}")
        sp.add_argument("--limit", type=int, default=10_000,
                        help="at most this many per run (default 10000)")
        sp.set_defaults(func=func)


def _filters(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--endpoint", help="held for this endpoint id")
    sp.add_argument("--reason", help="with this hold reason (e.g. retrodated, halted_global)")
    sp.add_argument("--app", help="for this app id")
