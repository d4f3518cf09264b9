"""What ``postbacks anomaly calibrate`` does the same for either scope: read a record's
event-time minute and payout, ``deliveries.v1`` by time range, print the days, and write a
recommendation (audited)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from postbacks.cli_output import fail, print_table
from postbacks.core.anomaly.detectors import MAX_PAYOUT_MICROS
from postbacks.core.anomaly.recommend import DayRow
from postbacks.core.anomaly.rolling import RollingThresholds
from postbacks.core.instants import MIN_OCCURRED_AT_MS, InstantError, parse_instant
from postbacks.settings import Settings

if TYPE_CHECKING:
    from postbacks.db.connect import Connection

__all__ = ["Write", "apply", "iso", "minute_of", "parse_ms", "print_days", "read_range",
           "write_thresholds"]


def parse_ms(text: str | None, what: str) -> int | None:
    if text is None:
        return None
    try:
        return parse_instant(text, what)
    except InstantError as exc:
        raise ValueError(str(exc)) from None


def iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def minute_of(occurred_at: object, payout: object) -> tuple[int, int] | None:
    """(event-time minute, payout micros) of one record; None when either is unusable as
    the gate judges it (a payout over USD 1M, an ``occurred_at`` before 2000): the gate
    holds those under enforce as missing inputs, and they carry no rate."""
    if type(payout) is not int or not 0 <= payout <= MAX_PAYOUT_MICROS:
        return None
    try:
        at = parse_instant(occurred_at, "occurred_at")
    except InstantError:
        return None
    return None if at < MIN_OCCURRED_AT_MS else (at // 60_000, payout)


def read_range(settings: Settings, since: int, until: int) -> Iterator[dict[str, Any]]:
    """Deliveries produced to ``deliveries.v1`` in [since, until) (record timestamps); an
    undecodable record is skipped (the gate would not count it either)."""
    from postbacks.codec import codec_for
    from postbacks.errors import DeadLetterError
    from postbacks.kafka.time_range import read_time_range
    from topics import TOPICS

    codec = codec_for("Delivery")
    for m in read_time_range(settings, settings.topic(TOPICS.deliveries.base), since, until,
                             group_id="postbacks-calibrate"):
        try:
            yield dict(codec.decode(m.value() or b""))
        except DeadLetterError:
            continue


def print_days(days: Iterable[DayRow], minutes: str = "MINUTES") -> None:
    """Per day: the minutes, payout, conversions, trips, would-have-held and the closest
    a threshold came (k and h)."""
    print_table(
        ["DAY", minutes, "PAYOUT_USD", "CONVERSIONS", "TRIPS", "HELD", "HELD_USD",
         "CLOSEST_K", "CLOSEST_H"],
        [[d.day, d.minutes, f"{d.payout_micros / 1e6:,.2f}", d.count, d.trips,
          d.held_count, f"{d.held_micros / 1e6:,.2f}",
          "-" if d.closest is None else f"{d.closest:.2f}",
          "-" if d.closest_h is None else f"{d.closest_h:.2f}"] for d in days])


Write = Callable[["Connection"], str]  # one row written; what to print


def apply(settings: Settings, args: argparse.Namespace, writes: Sequence[Write]) -> int:
    """Run ``writes`` in one transaction and print what each wrote once it has committed:
    ``--apply --apply-burst`` writes both rows or neither. A refusal (a bad value, the
    database's) rolls every write back and is the command's error (exit 2)."""
    from postbacks.db.connect import DatabaseError, connect

    try:
        with connect(settings.database_url) as conn, conn.transaction():
            done = [write(conn) for write in writes]
    except (ValueError, DatabaseError) as exc:
        what = str(exc).strip() or type(exc).__name__
        return fail(args, f"nothing applied: {what}", 2)
    for line in done:
        print(line)
    return 0


def write_thresholds(conn: Connection, args: argparse.Namespace, scope: str,
                     scope_key: str, rec: RollingThresholds, mode: str | None,
                     who_follows: str) -> str:
    """Write the recommended ``k`` and ``h`` to a value-rate row, audited; its mode kept,
    a missing row created in ``detect`` (nothing enforces without an explicit decision)."""
    from postbacks.db.anomaly import set_mode

    row = set_mode(conn, scope=scope, scope_key=scope_key, detector="value_rate",
                   mode=mode or "detect", params={"k": rec.k, "h": rec.cusum_h},
                   actor=args.actor, note=args.note or (
                       f"postbacks anomaly calibrate --scope {scope} --apply"))
    return (f"\napplied: {row.target_id} mode {row.mode}, params {row.params} (audited; "
            f"{who_follows} at the gates' next config refresh)")
