"""``postbacks anomaly calibrate --scope endpoint``: every endpoint's rolling detector
replayed over its own history, and the thresholds the endpoints' default row supports.

The same sources as the global calibration (PostgreSQL's deliveries, ``deliveries.v1`` by
time range, a JSON-lines file of deliveries or conversions with an ``endpoint_id``), summed
per endpoint and event-time minute, each endpoint run through
:func:`postbacks.core.anomaly.recommend.calibrate` with its own thresholds now and the
gate's endpoint policy. The report sums the days over the endpoints, lists the endpoints
closest to tripping, and recommends ``k`` and ``h`` for the default row (``*``): the
highest needed among the endpoints that follow it, plus the margins. ``--apply`` writes
them to that row (audited; its mode kept, a missing row created in ``detect``). An endpoint
with a value-rate row of its own keeps its own thresholds: its needed ``k`` is listed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from postbacks.cli_output import fail, print_json, print_table
from postbacks.core.anomaly.detectors import MAX_PAYOUT_MICROS
from postbacks.core.anomaly.endpoint_state import ENDPOINT_POLICY
from postbacks.core.anomaly.recommend import (
    MIN_H,
    MIN_K,
    Calibration,
    DayRow,
    Needed,
    calibrate,
)
from postbacks.core.anomaly.rolling import ENDPOINT_ROLLING, RollingThresholds
from postbacks.core.instants import MIN_OCCURRED_AT_MS
from postbacks.settings import Settings
from streams.anomaly_gate.calibrate_common import (
    apply,
    iso,
    minute_of,
    print_days,
    read_range,
    write_thresholds,
)

__all__ = ["Endpoints", "endpoint_minutes_from_db", "run_endpoints"]

Minutes = dict[int, list[int]]  # minute -> [payout micros, count]
Endpoints = dict[str, Minutes]


def endpoint_minutes_from_db(settings: Settings, since: int, until: int) -> Endpoints:
    from postbacks.db.connect import connect

    out: Endpoints = defaultdict(dict)
    with connect(settings.database_url) as conn:
        cur = conn.execute(
            "SELECT endpoint_id, (snapshot->>'occurred_at')::bigint / 60000 AS m,"
            " sum(payout_usd_micros)::bigint, count(*) FROM deliveries"
            " WHERE payout_usd_micros BETWEEN 0 AND %s"
            " AND snapshot->>'occurred_at' ~ '^[0-9]+$'"
            " AND (snapshot->>'occurred_at')::bigint >= %s"
            " AND (snapshot->>'occurred_at')::bigint < %s GROUP BY 1, 2",
            (MAX_PAYOUT_MICROS, max(since, MIN_OCCURRED_AT_MS), until))
        for ep, m, micros, n in cur:
            out[str(ep)][int(m)] = [int(micros), int(n)]
    return dict(out)


def _count(out: Endpoints, ep: object, conv: Mapping[str, Any]) -> None:
    got = minute_of(conv.get("occurred_at"), conv.get("payout_usd_micros"))
    if got is not None and isinstance(ep, str) and ep:
        cell = out[ep].setdefault(got[0], [0, 0])
        cell[0] += got[1]
        cell[1] += 1


def _from_topic(settings: Settings, since: int, until: int,
                progress: Callable[[int], None]) -> Endpoints:
    out: Endpoints = defaultdict(dict)
    for n, d in enumerate(read_range(settings, since, until), 1):
        _count(out, d.get("endpoint_id"), d.get("conversion") or {})
        if n % 250_000 == 0:
            progress(n)
    return dict(out)


def _from_file(path: str, since: int, until: int,
               progress: Callable[[int], None]) -> tuple[Endpoints, int]:
    """A JSON-lines file of deliveries (``endpoint_id`` and ``conversion``) or of
    conversions with an ``endpoint_id``; also the lines without an endpoint."""
    from streams.anomaly_gate.history import read_jsonl

    out: Endpoints = defaultdict(dict)
    missing = 0
    for n, line in enumerate(read_jsonl(path), 1):
        ev: dict[str, Any] = dict(line)
        inner = ev.get("conversion")
        conv: dict[str, Any] = inner if isinstance(inner, dict) else ev
        got = minute_of(conv.get("occurred_at"), conv.get("payout_usd_micros"))
        if got is not None and since <= got[0] * 60_000 < until:
            if not ev.get("endpoint_id"):
                missing += 1
            else:
                _count(out, ev["endpoint_id"], conv)
        if n % 250_000 == 0:
            progress(n)
    return dict(out), missing


@dataclass
class _Endpoint:
    endpoint: str
    own_row: bool  # its own value_rate row (else the default row's thresholds)
    cal: Calibration


def _thresholds(settings: Settings, offline: bool) -> tuple[
        Callable[[str], RollingThresholds], RollingThresholds, set[str], str | None]:
    """Each endpoint's rolling thresholds now, the default row's, the endpoints with a
    value-rate row of their own, and the default row's mode (None: no row)."""
    from streams.anomaly_gate.config import build_config

    if offline:
        return lambda _ep: ENDPOINT_ROLLING, ENDPOINT_ROLLING, set(), None
    from postbacks.db.anomaly import load_rows
    from postbacks.db.connect import connect

    with connect(settings.database_url) as conn:
        rows = load_rows(conn)
    cfg, _ = build_config(rows, settings.anomaly_global_key)
    own = {r.scope_key for r in rows if r.scope == "endpoint" and r.detector == "value_rate"
           and r.scope_key != "*"}
    mode = next((r.mode for r in rows if r.scope == "endpoint" and r.scope_key == "*"
                 and r.detector == "value_rate"), None)
    return cfg.thresholds, cfg.endpoint_thresholds.get("*", ENDPOINT_ROLLING), own, mode


def _series(minutes: Minutes) -> Iterator[tuple[int, int, int]]:
    for m in sorted(minutes):
        yield m, minutes[m][0], minutes[m][1]


def _days(cals: list[Calibration]) -> list[DayRow]:
    """The days summed over the endpoints; a day's closest k and h are the highest."""
    days: dict[str, DayRow] = {}
    for cal in cals:
        for d in cal.days.values():
            row = days.setdefault(d.day, DayRow(d.day))
            for f in ("minutes", "payout_micros", "count", "trips", "held_count",
                      "held_micros"):
                setattr(row, f, getattr(row, f) + getattr(d, f))
            for f in ("closest", "closest_h"):
                mine, theirs = getattr(row, f), getattr(d, f)
                if theirs is not None and (mine is None or theirs > mine):
                    setattr(row, f, theirs)
    return [days[k] for k in sorted(days)]


def _highest(needs: list[Needed | None]) -> Needed | None:
    got = [n for n in needs if n is not None]
    return max(got, key=lambda n: n.k) if got else None


def recommend_default(results: list[_Endpoint], margin: float, h_margin: float,
                      base: RollingThresholds) -> RollingThresholds:
    """``k`` and ``h`` for the default row: the highest needed among the endpoints that
    follow it, plus the margins (at least 3 and 8, as for the global scope)."""
    follow = [r.cal for r in results if not r.own_row]
    need = _highest([c.needed for c in follow])
    need_h = _highest([c.needed_h for c in follow])
    return replace(base, k=round(max(MIN_K, (need.k if need else 0.0) + margin), 2),
                   cusum_h=round(max(MIN_H, (need_h.k if need_h else 0.0) + h_margin), 2))


def run_endpoints(settings: Settings, args: argparse.Namespace, since: int, until: int,
                  incident: tuple[int, int] | None) -> int:
    t0 = time.perf_counter()

    def progress(n: int) -> None:
        if not args.quiet:
            print(f"[calibrate] {n:,} records read, {time.perf_counter() - t0:.1f}s",
                  file=sys.stderr, flush=True)

    missing = 0
    if args.file:
        eps, missing = _from_file(args.file, since, until, progress)
        source = f"file {args.file}"
    elif args.topic:
        eps = _from_topic(settings, since, until, progress)
        source = "topic deliveries.v1"
    else:
        eps = endpoint_minutes_from_db(settings, since, until)
        source = "PostgreSQL deliveries"
    if missing:
        print(f"[calibrate] {missing:,} records without an endpoint_id left out",
              file=sys.stderr)
    if not eps:
        return fail(args, f"no endpoint payouts in {source} between {iso(since)} and "
                    f"{iso(until)}" + (" (--scope endpoint needs an endpoint_id per line)"
                                       if missing else ""), 1)
    thresholds, default_now, own, mode = _thresholds(settings,
                                                     offline=bool(args.file) and not args.apply)

    def scan(th_of: Callable[[str], RollingThresholds], what: str) -> list[_Endpoint]:
        out = []
        for i, ep in enumerate(sorted(eps), 1):
            out.append(_Endpoint(ep, ep in own, calibrate(
                _series(eps[ep]), th_of(ep), policy=ENDPOINT_POLICY, incident=incident)))
            if not args.quiet and (i % 50 == 0 or i == len(eps)):
                print(f"[calibrate] {what}: {i:,} of {len(eps):,} endpoints, "
                      f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        return out

    now = scan(thresholds, "current thresholds")
    rec = recommend_default(now, args.margin, args.h_margin, default_now)
    again = scan(lambda ep: thresholds(ep) if ep in own else rec, "recommended k")
    minutes = sum(len(m) for m in eps.values())
    print(f"history: {source}, {iso(min(min(m) for m in eps.values()) * 60_000)} .. "
          f"{iso((max(max(m) for m in eps.values()) + 1) * 60_000)}, {len(eps):,} endpoints, "
          f"{minutes:,} endpoint-minutes with payouts; {len(own & set(eps)):,} with a "
          f"value-rate row of their own"
          + (f"; incident {iso(incident[0])} .. {iso(incident[1])}" if incident else ""))
    print(f"\nevery endpoint with its thresholds now (default row: k={default_now.k:g}, "
          f"h={default_now.cusum_h:g}, multiple={default_now.multiple:g}, "
          f"floor={default_now.floor_micros / 1e6:g} USD)")
    days = _days([r.cal for r in now])
    print_days(days, "ENDPOINT_MINUTES")
    closest = sorted((r for r in now if r.cal.needed is not None),
                     key=lambda r: -r.cal.needed.k)[:args.top]  # type: ignore[union-attr]
    print(f"\nthe {len(closest)} endpoints closest to tripping (outside the incident):")
    print_table(["ENDPOINT", "NEEDED_K", "SPAN", "CHANNEL", "MINUTE_ENDING", "TRIPS_NOW",
                 "THRESHOLDS"],
                [[r.endpoint, f"{r.cal.needed.k:.2f}", r.cal.needed.span,  # type: ignore[union-attr]
                  r.cal.needed.channel, iso(r.cal.needed.at_ms),  # type: ignore[union-attr]
                  r.cal.trips_outside, "own row" if r.own_row else "default"]
                 for r in closest])
    print(f"recommended for the default row: k {rec.k:g}, h {rec.cusum_h:g} (the highest "
          f"needed among the endpoints following it + margins {args.margin:g} and "
          f"{args.h_margin:g}; at least {MIN_K:g} and {MIN_H:g}); now k {default_now.k:g}, "
          f"h {default_now.cusum_h:g}")
    print(f"with it: {sum(r.cal.trips_outside for r in again)} trips outside the incident")
    if incident is not None:
        for label, res in (("now", now), ("recommended", again)):
            hits = [r.cal.incident_trip_ms for r in res if r.cal.incident_trip_ms is not None]
            print(f"incident, {label}: {len(hits)} endpoint(s) tripped"
                  + (f", the first at {iso(min(hits))}, "
                     f"{(min(hits) - incident[0]) / 60_000:.0f} min after its start"
                     if hits else ""))
    if args.json:
        print_json({"recommended": asdict(rec), "current_default": asdict(default_now),
                    "days": [asdict(d) for d in days],
                    "endpoints": [{"endpoint": r.endpoint, "own_row": r.own_row,
                                   "needed": None if r.cal.needed is None
                                   else asdict(r.cal.needed),
                                   "needed_h": None if r.cal.needed_h is None
                                   else asdict(r.cal.needed_h),
                                   "trips_outside": r.cal.trips_outside,
                                   "incident_trip_ms": r.cal.incident_trip_ms}
                                  for r in now]})
    if args.apply:
        return apply(settings, args, [lambda conn: write_thresholds(
            conn, args, "endpoint", "*", rec, mode,
            "every endpoint without a value-rate row of its own follows it")])
    print("\n(not applied: --apply --actor YOU writes it to the default row, audited)")
    return 0
