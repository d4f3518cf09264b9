"""``postbacks anomaly calibrate``, global scope: the retrodated burst replayed over the
same history, with the ``burst_count`` it supports (postbacks/core/anomaly/burst_recommend.py).

The history's retrodated deliveries per event-time minute (retrodated as the gate judges
them, with each endpoint's retrodating window) go through the aggregator's own burst code
with the global retrodating row's ``burst_count`` now (absent: the burst is off, and only
the recommendation is shown), then again with the recommendation. ``--apply-burst``
writes the recommended count to the global retrodating row (audited; its mode kept, a
missing row created ``off``: the burst halts nothing until a person sets the row to
``enforce``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from postbacks.core.anomaly.burst_recommend import (
    MIN_BURST_COUNT,
    BurstCalibration,
    calibrate_burst,
    recommend_burst,
)
from postbacks.core.anomaly.retro_burst import BurstPolicy
from streams.anomaly_gate.calibrate_common import iso

if TYPE_CHECKING:
    from postbacks.db.connect import Connection

__all__ = ["burst_report", "write_burst"]


def _trip(label: str, cal: BurstCalibration, incident: tuple[int, int] | None) -> str:
    if cal.policy.floor == 0:
        return f"  incident, {label}: the burst is off"
    at = cal.incident_trip_ms
    return (f"  incident, {label}: " + ("never tripped" if at is None or incident is None else
            f"tripped at {iso(at)}, {(at - incident[0]) / 60_000:.0f} min after its start"))


def burst_report(series: Iterable[tuple[int, int]], policy: BurstPolicy, window_ms: int,
                 margin: float, incident: tuple[int, int] | None,
                 progress: Callable[[int, int], None]) -> tuple[BurstPolicy, dict[str, Any]]:
    """Print the burst's section of the report; the recommended policy and the section as
    JSON. ``series``: (minute, retrodated deliveries), oldest first."""
    minutes = list(series)
    cal = calibrate_burst(minutes, policy, incident=incident, progress=progress)
    rec = recommend_burst(cal, margin)
    again = calibrate_burst(minutes, rec, incident=incident)
    need = cal.needed
    now = "off (no burst_count)" if policy.floor == 0 else f"burst_count {policy.floor}"
    print(f"\nretrodated burst ({policy.span}-min span; the global retrodating row: {now}; "
          f"default window {window_ms / 86_400_000:g} days)")
    print(f"  retrodated deliveries in the history: {cal.retrodated:,} over "
          f"{cal.minutes:,} minutes")
    print("  busiest span outside the incident that only the count would stop: "
          + ("none" if need is None else
             f"{need.count} retrodated deliveries, minute ending {iso(need.at_ms)} (usual "
             f"{need.usual:.1f})"))
    if policy.floor:
        print(f"  trips outside the incident with burst_count {policy.floor}: "
              f"{cal.trips_outside}")
    print(f"  recommended: burst_count {rec.floor} (that count + {margin:.0%}, above it, "
          f"at least {MIN_BURST_COUNT}); with it: {again.trips_outside} trips outside the "
          "incident")
    if incident is not None:
        print(_trip("now", cal, incident))
        print(_trip("recommended", again, incident))
    return rec, {
        "current": policy.floor, "recommended": rec.floor, "retrodated": cal.retrodated,
        "needed": None if need is None else {"count": need.count, "at_ms": need.at_ms,
                                             "usual": need.usual},
        "trips_outside": {"current": cal.trips_outside, "recommended": again.trips_outside},
        "incident_trip_ms": {"current": cal.incident_trip_ms,
                             "recommended": again.incident_trip_ms},
    }


def write_burst(conn: Connection, args: argparse.Namespace, key: str,
                rec: BurstPolicy) -> str:
    """Write the recommended ``burst_count`` to the global retrodating row, audited. The
    row's mode is read and kept (locked until the transaction ends); a missing row is
    created ``off``, so arming nothing (not even detect-mode signals for every endpoint).
    The caller runs it in its transaction (``calibrate_common.apply``)."""
    from postbacks.db.anomaly import set_mode

    got = conn.execute(
        "SELECT mode FROM payout_anomaly_settings WHERE scope = 'global'"
        " AND scope_key = %s AND detector = 'retrodating' FOR UPDATE", (key,)).fetchone()
    row = set_mode(conn, scope="global", scope_key=key, detector="retrodating",
                   mode="off" if got is None else got[0], params={"burst_count": rec.floor},
                   actor=args.actor,
                   note=args.note or "postbacks anomaly calibrate --apply-burst")
    return (f"\napplied: {row.target_id} mode {row.mode}, burst_count {rec.floor} (audited; "
            "the global aggregator follows it at the gates' next config refresh"
            + ("; it halts nothing until the row is set to enforce)" if row.mode != "enforce"
               else ")"))
