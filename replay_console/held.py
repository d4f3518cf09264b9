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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from postbacks.cli_args import note
from postbacks.cli_output import fail, iso, print_json, print_table, usd
from postbacks.records import DeliveryRecord
from postbacks.settings import Settings

if TYPE_CHECKING:
    from postbacks.db.anomaly import HeldDelivery

__all__ = [
    "CONFIRM_ABOVE",
    "RELEASE_TIER",
    "HeldError",
    "NeedsConfirmation",
    "Resolved",
    "add_parser",
    "list_cmd",
    "redrive_record",
    "reject_cmd",
    "release_cmd",
    "released_record",
    "resolve_held",
]

CONFIRM_ABOVE = 100  # resolving more deliveries than this needs --yes
RELEASE_TIER = "5s"  # the first retry tier
_STAGE = "held-cli"


def redrive_record(
    *, delivery_id: str, endpoint_id: str, idempotency_key: str, snapshot: dict[str, Any],
    created_at_ms: int, attempt: int, trigger: str, actor: str, now_ms: int,
    override: str | None = None,
) -> DeliveryRecord:
    """A stored delivery as it is re-driven (release, replay): its original id and
    idempotency key, ``trigger``/``triggered_by``, due now, a fresh retry ceiling; checked
    against the Delivery schema (a ValueError names the delivery when its stored snapshot
    is not a valid record)."""
    from postbacks.codec import codec_for
    from postbacks.errors import DeadLetterError

    d: dict[str, Any] = {
        "delivery_id": delivery_id, "endpoint_id": endpoint_id,
        "idempotency_key": idempotency_key, "conversion": snapshot,
        "created_at": created_at_ms, "attempt": attempt, "trigger": trigger,
        "triggered_by": actor, "due_at": now_ms, "enqueued_at": None,
        "first_attempt_at": None, "hold_reason": None, "last_error": None,
        "override": override,
    }
    codec = codec_for("Delivery")
    try:
        return cast(DeliveryRecord, codec.decode(codec.encode(d)))
    except (ValueError, DeadLetterError) as exc:  # (an attempt count out of range too)
        raise ValueError(f"{delivery_id}: stored snapshot is not a valid delivery: {exc}"
                         ) from exc


def released_record(h: HeldDelivery, *, actor: str, now_ms: int,
                    trigger: str = "release") -> DeliveryRecord:
    """The held delivery as it is re-driven (see :func:`redrive_record`)."""
    return redrive_record(
        delivery_id=h.delivery_id, endpoint_id=h.endpoint_id,
        idempotency_key=h.idempotency_key, snapshot=h.snapshot, created_at_ms=h.created_at_ms,
        attempt=h.attempt_count, trigger=trigger, actor=actor, now_ms=now_ms,
    )


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


class HeldError(Exception):
    """A release or reject that was refused; nothing was resolved. ``code`` is the CLI's
    exit code (2 = bad request, 1 = nothing to do / needs confirmation)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class NeedsConfirmation(HeldError):
    """More than :data:`CONFIRM_ABOVE` deliveries match: confirm with the count."""

    def __init__(self, count: int, message: str) -> None:
        super().__init__(message, 1)
        self.count = count


@dataclass(frozen=True, slots=True)
class Resolved:
    kind: str  # released | rejected
    delivery_ids: tuple[str, ...]
    skipped: tuple[str, ...]  # "<delivery_id>: why" for snapshots that are not valid records
    limit_reached: bool
    target: str  # where released deliveries went (the retry topic), or "never sent"


def selection_problem(delivery_ids: Sequence[str], *, endpoint: str | None,
                      reason: str | None, app: str | None, all_: bool,
                      actor: str) -> str | None:
    """An error message when the selection is missing or ambiguous."""
    filters = [endpoint, reason, app]
    if delivery_ids and (all_ or any(f is not None for f in filters)):
        return "--delivery-id cannot be combined with --all, --endpoint, --reason or --app"
    if all_ and any(f is not None for f in filters):
        return "--all cannot be combined with --endpoint, --reason or --app"
    if not (delivery_ids or all_ or any(f is not None for f in filters)):
        return "choose what to resolve: --delivery-id ID..., --endpoint/--reason/--app, or --all"
    if not actor.strip():  # a command's --actor, a token's name: checked where they come in
        return "--actor must name who you are"
    return None


def resolve_held(
    settings: Settings, *, kind: str, actor: str, note: str | None = None,
    delivery_ids: Sequence[str] = (), endpoint: str | None = None, reason: str | None = None,
    app: str | None = None, all_: bool = False, limit: int = 10_000,
    confirm: int | None = None, yes: bool = False, app_ids: Sequence[str] | None = None,
    held_until_ms: int | None = None,
) -> Resolved:
    """Release or reject held deliveries (``kind`` = released | rejected): one Kafka
    transaction, then one audit row per delivery. More than :data:`CONFIRM_ABOVE` need
    ``yes`` or ``confirm`` equal to the number that match; a ``confirm`` given must equal
    it whatever the number (a count read off a page is what the reviewer saw, not what
    matches at the click). ``held_until_ms``: only those held no later than that (the
    newest hold the page showed). Raises :class:`HeldError`."""
    from postbacks.codec import codec_for
    from postbacks.core.outcomes import make_outcome
    from postbacks.db.anomaly import audit_held, held_deliveries, lock_held
    from postbacks.db.connect import connect
    from postbacks.kafka.publish import publish_transaction
    from topics import TOPICS

    problem = selection_problem(delivery_ids, endpoint=endpoint, reason=reason, app=app,
                                all_=all_, actor=actor)
    if problem:
        raise HeldError(problem, 2)
    actor = actor.strip()
    release = kind == "released"
    verb = "release" if release else "reject"
    now_ms = int(time.time() * 1000)
    ids: list[str] = list(dict.fromkeys(delivery_ids))
    with connect(settings.database_url) as conn, conn.transaction():
        lock_held(conn)  # until commit: a concurrent release/reject waits, then skips these
        held = held_deliveries(
            conn, endpoint_id=endpoint, reason=reason, app_id=app,
            delivery_ids=ids or None, limit=max(limit, len(ids)), held_until_ms=held_until_ms,
        )
        if app_ids is not None:
            held = [h for h in held if h.app_id in app_ids]
        if ids:
            missing = [i for i in ids if i not in {h.delivery_id for h in held}]
            if missing:
                raise HeldError(f"not held (unknown, never held, or already resolved): "
                                f"{', '.join(missing)}; nothing was {kind}")
        if not held:
            raise HeldError(f"no held deliveries match; nothing was {kind}")
        if confirm is not None and confirm != len(held):
            raise NeedsConfirmation(
                len(held), f"{len(held)} held deliveries match now, not the {confirm} "
                f"confirmed; nothing was {kind}: look again, and confirm {len(held)} to "
                f"{verb} them")
        if len(held) > CONFIRM_ABOVE and not yes and confirm != len(held):
            raise NeedsConfirmation(
                len(held), f"{len(held)} held deliveries would be {kind}"
                f"{' (limit reached: more match)' if len(held) >= limit else ''}; "
                f"confirm to {verb} them")
        ok: list[HeldDelivery] = []
        items: list[tuple[str, bytes | None, bytes]] = []
        skipped: list[str] = []
        outcomes = settings.topic(TOPICS.outcomes.base)
        retry = settings.topic(TOPICS.retry_tier(RELEASE_TIER).base)
        for h in held:
            try:
                d = released_record(h, actor=actor, now_ms=now_ms,
                                    trigger="release" if release else "reject")
            except ValueError as exc:
                skipped.append(str(exc))
                continue
            key = h.endpoint_id.encode()
            why = f"{kind} by {actor}" + (f": {note}" if note else "")
            if release:
                items.append((retry, key, codec_for("Delivery").encode(d)))
            outcome = make_outcome(d, kind, now_ms=now_ms, actor=actor, reason=why)
            items.append((outcomes, key, codec_for("Outcome").encode(outcome)))
            ok.append(h)
        if ok:
            after = ({"status": "released", "triggered_by": actor} if release
                     else {"status": "rejected", "reason": f"rejected by {actor}"
                           + (f": {note}" if note else "")})
            # the audit rows (which keep these out of a second release) are written before
            # the publish: PostgreSQL failing on them publishes nothing; only its commit
            # failing after the publish leaves a retry able to release them again
            audit_held(conn, ok, action=f"held.{verb}", actor=actor, after=after, note=note)
            publish_transaction(settings, _STAGE, items)
    return Resolved(kind, tuple(h.delivery_id for h in ok), tuple(skipped),
                    len(held) >= limit, retry if release else "never sent")


def _resolve(settings: Settings, args: argparse.Namespace, kind: str) -> int:
    from replay_console.auth import CLI_PREFIX, name_problem

    problem = name_problem(args.actor, "--actor")
    if problem:
        return fail(args, problem, 2)
    try:
        r = resolve_held(  # audited as cli:<actor>, never taken for a console user's
            settings, kind=kind, actor=CLI_PREFIX + args.actor.strip(), note=args.note,
            delivery_ids=args.delivery_ids or (), endpoint=args.endpoint,
            reason=args.reason, app=args.app, all_=args.all, limit=args.limit, yes=args.yes,
        )
    except NeedsConfirmation as exc:
        verb = "release" if kind == "released" else "reject"
        print(f"{exc}; re-run with --yes to {verb} them", file=sys.stderr)
        return 1
    except HeldError as exc:
        return fail(args, str(exc), exc.code)
    verb = "release" if kind == "released" else "reject"
    for why in r.skipped:
        print(f"postbacks held {verb}: skipped {why}", file=sys.stderr)
    where = f" to {r.target}" if kind == "released" else " (never sent)"
    print(f"{kind} {len(r.delivery_ids)} held deliveries{where} by {args.actor.strip()}"
          + (f"; {len(r.skipped)} skipped (see above)" if r.skipped else ""))
    if r.limit_reached:
        print(f"limit {args.limit} reached: more may be held; run again", file=sys.stderr)
    return 1 if r.skipped else 0


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
    sp.add_argument("--limit", type=_limit, default=100, help="at most this many (default 100)")
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
        sp.add_argument("--note", type=note, help="why (audited, and in the outcome's reason)")
        sp.add_argument("--yes", action="store_true",
                        help=f"confirm resolving more than {CONFIRM_ABOVE}")
        sp.add_argument("--limit", type=_limit, default=10_000,
                        help="at most this many per run (default 10000)")
        sp.set_defaults(func=func)


MAX_LIMIT = 1_000_000  # --limit: at most this many per command


def _limit(text: str) -> int:
    """``--limit``: a whole number from 1 to :data:`MAX_LIMIT`."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to "
                                         f"{MAX_LIMIT}")
    return int(text)


def _filters(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--endpoint", help="held for this endpoint id")
    sp.add_argument("--reason", help="with this hold reason (e.g. retrodated, halted_global)")
    sp.add_argument("--app", help="for this app id")
