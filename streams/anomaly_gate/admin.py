"""``postbacks anomaly status | set-mode | close``: arming modes and durable halts.

``close`` is the only way a tripped scope resumes: a named person, a note, an audit row,
then a ``closed`` BreakerState on ``anomaly.control.v1`` that every gate applies. The
PostgreSQL change commits only after Kafka has acknowledged that record, so a failed publish
leaves the halt tripped in both places (run the command again).
:func:`publish_state` is also what the gate uses to publish its trips.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from postbacks.cli_args import finite, note, whole
from postbacks.cli_output import fail, iso, print_json, print_table
from postbacks.core.anomaly.modes import Detector, Mode
from postbacks.errors import ServiceUnavailable
from postbacks.records import BreakerStateRecord
from postbacks.settings import Settings

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from postbacks.db.anomaly import AnomalyRow

__all__ = [
    "add_parser",
    "breaker_record",
    "close_cmd",
    "control_key",
    "publish_state",
    "set_mode_cmd",
    "status_cmd",
]

_MICROS_PER_USD = 1_000_000
_MS_PER_DAY = 86_400_000


def control_key(scope: str, scope_key: str, detector: str) -> bytes:
    """The control-topic key of a scope's halt state."""
    return f"{scope}/{scope_key}/{detector}".encode()


def breaker_record(
    state: AnomalyRow | Mapping[str, Any], *, actor: str | None = None,
    observed: float | None = None, baseline: float | None = None, now_ms: int | None = None,
) -> BreakerStateRecord:
    """A BreakerState from a settings row (``changed_at`` = its ``state_changed_at``, else
    ``now_ms``) or from a mapping of the record's fields (missing optional fields: null)."""
    from postbacks.db.anomaly import AnomalyRow

    now = int(time.time() * 1000) if now_ms is None else now_ms
    if isinstance(state, AnomalyRow):
        return BreakerStateRecord(
            scope=state.scope, scope_key=state.scope_key, detector=state.detector,
            state=state.state, changed_at=state.state_changed_at_ms or now,
            reason=state.state_reason, actor=actor, observed_value=observed,
            baseline_value=baseline,
        )
    rec = dict(state)
    return BreakerStateRecord(
        scope=rec["scope"], scope_key=rec["scope_key"], detector=rec["detector"],
        state=rec["state"], changed_at=rec.get("changed_at") or now,
        reason=rec.get("reason"), actor=rec.get("actor", actor),
        observed_value=rec.get("observed_value", observed),
        baseline_value=rec.get("baseline_value", baseline),
    )


def publish_state(
    settings: Settings, state: AnomalyRow | Mapping[str, Any], *, actor: str | None = None,
    observed: float | None = None, baseline: float | None = None, now_ms: int | None = None,
    timeout_s: float = 30.0, producer: Producer | None = None,
) -> BreakerStateRecord:
    """Publish a scope's halt state on ``anomaly.control.v1`` (key
    ``scope/scope_key/detector``) and wait for the broker's acknowledgement; raises
    :class:`~postbacks.errors.ServiceUnavailable` when it is not acknowledged in
    ``timeout_s``. Blocking: from asyncio code, run it in an executor. Pass ``producer``
    to reuse one (it is flushed)."""
    from postbacks.codec import codec_for
    from postbacks.kafka.publish import publish_acked
    from topics import TOPICS

    rec = breaker_record(state, actor=actor, observed=observed, baseline=baseline,
                         now_ms=now_ms)
    value = codec_for("BreakerState").encode(rec)
    topic = settings.topic(TOPICS.anomaly_control.base)
    key = control_key(rec["scope"], rec["scope_key"], rec["detector"])
    publish_acked(settings, [(topic, key, value)], timeout_s=timeout_s, producer=producer)
    return rec


def status_cmd(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.anomaly import load_rows
    from postbacks.db.connect import connect

    with connect(settings.database_url) as conn:
        rows = load_rows(conn)
    if args.json:
        print_json([r.to_json() for r in rows])
        return 0
    if not rows:
        print("no anomaly settings rows: every detector is off everywhere")
        return 0
    tripped = [r for r in rows if r.state == "tripped"]
    print_table(
        ["SCOPE", "KEY", "DETECTOR", "MODE", "STATE", "SINCE", "PARAMS", "REASON"],
        [[r.scope, "* (every endpoint)" if r.scope == "endpoint" and r.scope_key == "*"
          else r.scope_key, r.detector, r.mode,
          "TRIPPED <<" if r.state == "tripped" else r.state, iso(r.state_changed_at_ms),
          ",".join(f"{k}={v}" for k, v in sorted(r.params.items())) or "-", r.state_reason]
         for r in rows],
    )
    if tripped:
        print(f"\n{len(tripped)} TRIPPED halt(s): everything in those scopes is held. "
              "Close one with `postbacks anomaly close --scope S --key K --detector D "
              "--actor YOU --note WHY`.")
    else:
        print("\nno halts tripped")
    return 0


def _key(settings: Settings, args: argparse.Namespace) -> str | None:
    if getattr(args, "all_endpoints", False):
        return "*" if args.scope == "endpoint" and args.key is None else None
    if args.key is not None:
        return str(args.key)
    return settings.anomaly_global_key if args.scope == "global" else None


def set_mode_cmd(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.anomaly import endpoint_exists, set_mode
    from postbacks.db.connect import connect

    key = _key(settings, args)
    if key is None:
        if getattr(args, "all_endpoints", False):
            return fail(args, "--all-endpoints goes with --scope endpoint and no --key", 2)
        return fail(args, "--key (the endpoint id) is required for --scope endpoint", 2)
    params: dict[str, Any] = {}
    if args.multiple is not None:
        params["multiple"] = args.multiple
    if args.floor_usd is not None:
        params["floor_micros"] = round(args.floor_usd * _MICROS_PER_USD)
    if args.k is not None:
        params["k"] = args.k
    if args.h is not None:
        params["h"] = args.h
    if args.single_multiple is not None:
        if args.scope != "endpoint":
            return fail(args, "--single-multiple goes with --scope endpoint (one payout "
                        "against the endpoint's peak)", 2)
        params["single_multiple"] = args.single_multiple
    if args.window_days is not None:
        params["window_ms"] = round(args.window_days * _MS_PER_DAY)
    if args.burst_count is not None:
        if args.scope != "global":
            return fail(args, "--burst-count goes with --scope global (the burst is a "
                        "global halt)", 2)
        params["burst_count"] = args.burst_count
    with connect(settings.database_url) as conn:
        try:
            row = set_mode(conn, scope=args.scope, scope_key=key, detector=args.detector,
                           mode=args.mode, params=params, actor=args.actor, note=args.note)
        except ValueError as exc:
            return fail(args, str(exc), 2)
        if args.scope == "endpoint" and key != "*" and not endpoint_exists(conn, key):
            print(f"postbacks anomaly set-mode: warning: no endpoint {key!r} is configured "
                  "(a typo?); the setting is stored anyway", file=sys.stderr)
    print(f"{row.target_id}: mode {row.mode}, params {row.params or '{}'}, "
          f"state {row.state} (unchanged)")
    return 0


def close_cmd(settings: Settings, args: argparse.Namespace) -> int:
    from postbacks.db.anomaly import NotTripped, close_halt
    from postbacks.db.connect import connect

    key = _key(settings, args)
    if key is None:
        if getattr(args, "all_endpoints", False):
            return fail(args, "--all-endpoints goes with --scope endpoint and no --key", 2)
        return fail(args, "--key (the endpoint id) is required for --scope endpoint", 2)
    with connect(settings.database_url) as conn, conn.transaction():
        try:
            row = close_halt(conn, scope=args.scope, scope_key=key, detector=args.detector,
                             actor=args.actor, note=args.note)
        except NotTripped as exc:
            return fail(args, str(exc), 1)
        except ValueError as exc:
            return fail(args, str(exc), 2)
        # Commit only once the control topic has it: a failure rolls the close back.
        try:
            publish_state(settings, row, actor=args.actor)
        except ServiceUnavailable as exc:
            raise ServiceUnavailable(f"{exc}; the halt stays tripped (nothing changed)") from exc
    print(f"{row.target_id}: closed by {args.actor} at {iso(row.state_changed_at_ms)}; "
          "published on the control topic")
    return 0


def add_parser(subparsers: Any) -> None:
    """Add ``anomaly`` and its actions to the top-level subparsers."""
    sub = cast(argparse._SubParsersAction, subparsers)  # type: ignore[type-arg]
    p = sub.add_parser(
        "anomaly", help="anomaly gate modes, halts, calibration and rehearsal",
        description="Show and change the anomaly gate's arming modes and durable halts "
        "(payout_anomaly_settings). Every change is audited.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    sp = actions.add_parser("status", help="modes and halt states (tripped highlighted)",
                            description="Every settings row: mode, params and halt state. "
                            "A missing row reads as off.")
    sp.add_argument("--json", action="store_true", help="JSON instead of a table")
    sp.set_defaults(func=status_cmd)

    scopes = ["endpoint", "global"]
    detectors = [d.value for d in Detector]

    def target(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--scope", required=True, choices=scopes,
                        help="endpoint: one endpoint (--key, or --all-endpoints); global: the "
                        "deployment's roll-up of every endpoint")
        sp.add_argument("--key", help="the endpoint id (scope endpoint); for global it "
                        "defaults to POSTBACKS_ANOMALY_GLOBAL_KEY ('*')")
        sp.add_argument("--detector", required=True, choices=detectors,
                        help="retrodating: conversions dated too far back; value_rate: the "
                        "payout value rate against its seasonal expectation")
        sp.add_argument("--actor", required=True, help="who you are (recorded in the audit log)")

    sp = actions.add_parser(
        "set-mode", help="set a detector's mode and params for a scope",
        description="Set the mode (off: skip, detect: metrics only, enforce: hold) and params "
        "of one (scope, detector). Given params are merged over the stored ones. Never "
        "changes the halt state.",
    )
    target(sp)
    sp.add_argument("--all-endpoints", action="store_true",
                    help="scope endpoint: the default of every endpoint without a row of its "
                    "own for this detector, new ones included (the key '*'); an endpoint's "
                    "own row, off included, overrides it")
    sp.add_argument("--mode", required=True, choices=[m.value for m in Mode],
                    help="off: skip; detect: metrics only; enforce: hold")
    sp.add_argument("--multiple", type=finite(0),
                    help="value_rate: a span trips only above this multiple of its "
                    "expectation (default 1.1 global, 2 endpoint)")
    sp.add_argument("--floor-usd", type=finite(0),
                    help="value_rate: and only with an excess over the expectation above "
                    "this (USD; default 50 global, 200 endpoint)")
    sp.add_argument("--k", type=finite(0),
                    help="value_rate: the rolling detector's score threshold (sigmas; "
                    "default 4.5 global, 5 endpoint; `postbacks anomaly calibrate` "
                    "recommends one)")
    sp.add_argument("--h", type=finite(0),
                    help="value_rate: the CUSUM arms' threshold (log-likelihood ratio; "
                    "default 12.5; `postbacks anomaly calibrate` recommends one)")
    sp.add_argument("--single-multiple", type=finite(0),
                    help="value_rate, endpoint: hold one payout over this multiple of the "
                    "largest the endpoint was paid in 4 weeks (and over it by the floor; "
                    "default 5; 0 turns the check off)")
    sp.add_argument("--window-days", type=finite(0),
                    help="retrodating: hold when created - completed exceeds this")
    sp.add_argument("--burst-count", type=whole(0),
                    help="retrodating, global: halt the global scope when this many "
                    "retrodated deliveries come within 15 event-time minutes, over twice "
                    "their usual count (off unless set; 0 turns it off again; 50 suits "
                    "about 50 conversions a minute at the quietest hour; see "
                    "docs/containment.md)")
    sp.add_argument("--note", type=note, help="why (recorded in the audit log)")
    sp.set_defaults(func=set_mode_cmd)

    sp = actions.add_parser(
        "close", help="close a tripped halt (a person, with a note)",
        description="Move a tripped scope back to closed, audited, and publish the closed "
        "state on the control topic so every gate resumes. Only a person can do this.",
    )
    target(sp)
    sp.add_argument("--note", type=note, required=True, help="why it is safe to resume")
    sp.set_defaults(func=close_cmd)

    from streams.anomaly_gate import calibrate_global, rehearse

    sp = actions.add_parser(
        "calibrate", help="replay your history through the rolling detector (global, or "
        "every endpoint's) and recommend its thresholds",
        description="Sum a history -- PostgreSQL's deliveries (default), deliveries.v1 by "
        "time range (--topic) or a JSON-lines file (--file) -- per event-time minute, run it "
        "through the global rolling detector (or, with --scope endpoint, every endpoint's "
        "own) with the thresholds configured now, and print per day the payout, trips and "
        "would-have-held payout, the highest score a threshold must stay above, the "
        "recommended k and h (those plus the margins) and the history re-run with them; for "
        "a labelled incident, when it would have tripped. --apply writes them to the global "
        "value_rate row, or the endpoints' default row (audited). Exit 1 when the range "
        "holds no payouts.")
    calibrate_global.add_arguments(sp)
    sp.set_defaults(func=calibrate_global.run)

    sp = actions.add_parser(
        "rehearse", help="feed a history into conversions.v1, paced by event time",
        description="Incident rehearsal: produce a recorded (--file) or generated "
        "(--generate) conversion history to conversions.v1 through the real producer, "
        "paced at --speedup, so it runs through fan-out, the gate, the held queue and "
        "trips. Exit 1 when an event was not produced or not acknowledged.")
    rehearse.add_arguments(sp)
    sp.set_defaults(func=rehearse.run)
