"""``postbacks anomaly calibrate``: the global rolling detector replayed over the operator's
own history, with the threshold it supports.

History comes from PostgreSQL's delivery records (``--from-db``, the default), from
``deliveries.v1`` by time range (``--topic``), or from a JSON-lines file of conversions
(``--file``). It is summed per event-time minute -- what the gate's aggregator sums -- and
run through :func:`postbacks.core.anomaly.recommend.calibrate` with the thresholds the
global value-rate row configures now. The report: per day, payout, trips and the
would-have-held payout (a trip halts the scope until a person closes it), and the
highest score a threshold must stay above; then the recommended ``k`` (that score plus
``--margin``), the same history re-run with it (zero trips outside the incident) and, for
a labelled incident (``--incident-start``/``--incident-end``), when it would have tripped.
``--apply`` writes the recommended ``k`` to the global row (audited; the mode is kept, and
a missing row is created in ``detect``: nothing enforces without an explicit decision).
The same minutes' retrodated deliveries give the retrodated burst's ``burst_count``
(calibrate_burst.py; ``--apply-burst``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from postbacks.cli_args import note
from postbacks.cli_output import fail, print_json
from postbacks.core.anomaly.detectors import MAX_PAYOUT_MICROS, retrodated
from postbacks.core.anomaly.modes import ALL_ENDPOINTS
from postbacks.core.anomaly.recommend import MIN_H, Calibration, calibrate, recommend
from postbacks.core.anomaly.rolling import RollingThresholds
from postbacks.core.instants import MAX_MS, MIN_OCCURRED_AT_MS
from postbacks.settings import Settings
from streams.anomaly_gate.calibrate_burst import burst_report, write_burst
from streams.anomaly_gate.calibrate_common import (
    Write,
    apply,
    iso,
    minute_of,
    parse_ms,
    print_days,
    read_range,
    write_thresholds,
)
from streams.anomaly_gate.calibrate_endpoints import run_endpoints
from streams.anomaly_gate.config import GateConfig, build_config

__all__ = ["add_arguments", "run"]

_DAY_MS = 86_400_000
Minutes = dict[int, list[int]]  # minute -> [payout micros, count, retrodated count]


def _from_db(settings: Settings, since: int, until: int, cfg: GateConfig) -> Minutes:
    from postbacks.db.connect import connect

    own = cfg.retrodating_window_ms  # per endpoint ("*": every endpoint without its own)
    eps = [e for e in own if e != ALL_ENDPOINTS]
    out: Minutes = {}
    with connect(settings.database_url) as conn:
        cur = conn.execute(
            "SELECT (d.snapshot->>'occurred_at')::bigint / 60000 AS m,"
            " sum(d.payout_usd_micros)::bigint, count(*),"
            " count(*) FILTER (WHERE CASE WHEN d.snapshot->>'source_created_at' ~ '^[0-9]{1,15}$'"
            "  AND d.snapshot->>'source_completed_at' ~ '^[0-9]{1,15}$'"
            "  THEN (d.snapshot->>'source_created_at')::bigint <= %s"
            "   AND (d.snapshot->>'source_completed_at')::bigint <= %s"
            "   AND (d.snapshot->>'source_created_at')::bigint"
            "    - (d.snapshot->>'source_completed_at')::bigint > coalesce(w.window_ms, %s)"
            "  ELSE false END)"
            " FROM deliveries d"
            " LEFT JOIN unnest(%s::text[], %s::bigint[]) AS w(endpoint_id, window_ms)"
            "  ON w.endpoint_id = d.endpoint_id"
            " WHERE d.payout_usd_micros BETWEEN 0 AND %s"
            " AND d.snapshot->>'occurred_at' ~ '^[0-9]+$'"
            " AND (d.snapshot->>'occurred_at')::bigint >= %s"
            " AND (d.snapshot->>'occurred_at')::bigint < %s GROUP BY 1",
            (MAX_MS, MAX_MS, cfg.window_ms(ALL_ENDPOINTS), eps, [own[e] for e in eps],
             MAX_PAYOUT_MICROS,
             max(since, MIN_OCCURRED_AT_MS), until))
        for m, micros, n, retro in cur:
            out[int(m)] = [int(micros), int(n), int(retro)]
    return out


def _add(out: Minutes, rec: Mapping[str, Any], window_ms: int,
         event_time: tuple[int, int] | None = None) -> bool:
    """Count one conversion in its minute (``event_time``: only within [since, until) of
    event time); False when the gate would not count it, or it is out of that range."""
    got = minute_of(rec.get("occurred_at"), rec.get("payout_usd_micros"))
    if got is None or (event_time is not None
                       and not event_time[0] <= got[0] * 60_000 < event_time[1]):
        return False
    cell = out[got[0]]
    cell[0] += got[1]
    cell[1] += 1
    if retrodated(rec.get("source_created_at"), rec.get("source_completed_at"),
                  window_ms) is True:
        cell[2] += 1
    return True


def _from_file(path: str, since: int, until: int, cfg: GateConfig,
               progress: Callable[[int], None]) -> Minutes:
    from streams.anomaly_gate.history import read_jsonl

    out: Minutes = defaultdict(lambda: [0, 0, 0])
    for n, ev in enumerate(read_jsonl(path), 1):
        _add(out, ev, cfg.window_ms(str(ev.get("endpoint_id") or ALL_ENDPOINTS)),
             (since, until))
        if n % 250_000 == 0:
            progress(n)
    return dict(out)


def _from_topic(settings: Settings, since: int, until: int, cfg: GateConfig,
                progress: Callable[[int], None]) -> Minutes:
    out: Minutes = defaultdict(lambda: [0, 0, 0])
    for n, d in enumerate(read_range(settings, since, until), 1):
        _add(out, d.get("conversion") or {}, cfg.window_ms(str(d.get("endpoint_id"))))
        if n % 250_000 == 0:
            progress(n)
    return dict(out)


def _series(minutes: Minutes) -> Iterator[tuple[int, int, int]]:
    for m in sorted(minutes):
        yield m, minutes[m][0], minutes[m][1]


@dataclass(frozen=True, slots=True)
class _Now:
    """The gate's configuration now, and the global value_rate row's mode (None: no row)."""

    cfg: GateConfig
    mode: str | None


def _current(settings: Settings, offline: bool) -> _Now:
    if offline:
        cfg, _ = build_config([], settings.anomaly_global_key)
        return _Now(cfg, None)
    from postbacks.db.anomaly import load_rows
    from postbacks.db.connect import connect

    with connect(settings.database_url) as conn:
        rows = load_rows(conn)
    cfg, _ = build_config(rows, settings.anomaly_global_key)

    return _Now(cfg, next((r.mode for r in rows if r.scope == "global"
                           and r.detector == "value_rate"
                           and r.scope_key == settings.anomaly_global_key), None))


def _report(cal: Calibration, title: str) -> None:
    print(f"\n{title} (k={cal.thresholds.k:g}, h={cal.thresholds.cusum_h:g}, "
          f"multiple={cal.thresholds.multiple:g}, "
          f"floor={cal.thresholds.floor_micros / 1e6:g} USD)")
    print_days(cal.days.values())
    print(f"first trip: {iso(cal.first_trip_ms)}")


def run(settings: Settings, args: argparse.Namespace) -> int:
    now = int(time.time() * 1000)
    try:
        to, frm = parse_ms(args.until, "--to"), parse_ms(args.since, "--from")
        until = now if to is None else to
        since = until - int(args.days * _DAY_MS) if frm is None else frm
        inc_start = parse_ms(args.incident_start, "--incident-start")
        inc_end = parse_ms(args.incident_end, "--incident-end")
    except ValueError as exc:
        return fail(args, str(exc), 2)
    if since >= until:
        return fail(args, "--from must be before --to", 2)
    if (inc_start is None) != (inc_end is None) or (inc_start or 0) > (inc_end or 0):
        return fail(args, "--incident-start and --incident-end go together, start first", 2)
    if not all(math.isfinite(x) and x >= 0 for x in (args.margin, args.h_margin)):
        return fail(args, "--margin and --h-margin must be >= 0", 2)
    if (args.apply or args.apply_burst) and not (args.actor and args.actor.strip()):
        return fail(args, "--apply and --apply-burst need --actor (who is making this "
                    "change)", 2)
    if not (math.isfinite(args.burst_margin) and args.burst_margin >= 0):
        return fail(args, "--burst-margin must be >= 0", 2)
    if args.apply_burst and args.scope == "endpoint":
        return fail(args, "--apply-burst is for the global scope: the retrodated burst "
                    "halts the global scope only", 2)
    if args.top < 1:
        return fail(args, "--top must be >= 1", 2)
    if args.scope == "endpoint":
        return run_endpoints(settings, args, since, until,
                             None if inc_start is None or inc_end is None
                             else (inc_start, inc_end))
    t0 = time.perf_counter()

    def progress(n: int) -> None:
        if not args.quiet:
            print(f"[calibrate] {n:,} records read, {time.perf_counter() - t0:.1f}s",
                  file=sys.stderr, flush=True)

    now_cfg = _current(settings, offline=bool(args.file) and not (args.apply
                                                                   or args.apply_burst))
    if args.file:
        minutes = _from_file(args.file, since, until, now_cfg.cfg, progress)
        source = f"file {args.file}"
    elif args.topic:
        minutes = _from_topic(settings, since, until, now_cfg.cfg, progress)
        source = "topic deliveries.v1"
    else:
        minutes = _from_db(settings, since, until, now_cfg.cfg)
        source = "PostgreSQL deliveries"
    if not minutes:
        return fail(args, f"no payouts in {source} between {iso(since)} and {iso(until)}",
                    1)
    current, mode = now_cfg.cfg.global_rolling, now_cfg.mode
    incident = None if inc_start is None or inc_end is None else (inc_start, inc_end)

    def scan(th: RollingThresholds, what: str) -> Calibration:
        def tick(n: int, at: int) -> None:
            if not args.quiet:
                print(f"[calibrate] {what}: {n:,} minutes (event time {iso(at)}), "
                      f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        return calibrate(_series(minutes), th, incident=incident, progress=tick)

    cal = scan(current, "current thresholds")
    rec = recommend(cal, args.margin, h_margin=args.h_margin)
    again = scan(rec, "recommended k")
    print(f"history: {source}, {iso(min(minutes) * 60_000)} .. "
          f"{iso((max(minutes) + 1) * 60_000)}, {cal.minutes:,} minutes with payouts"
          + (f", incident {iso(inc_start)} .. {iso(inc_end)}" if incident else ""))
    _report(cal, "with the global row's thresholds now")
    need = cal.needed
    print("\nhighest score outside the incident: "
          + ("none over the multiple and floor" if need is None else
             f"k {need.k:.2f} ({need.span}-min span, {need.channel}, minute ending "
             f"{iso(need.at_ms)})"))
    need_h = cal.needed_h
    print("highest CUSUM statistic outside the incident: "
          + ("none over the multiple and floor" if need_h is None else
             f"h {need_h.k:.2f} ({need_h.channel} arm, {need_h.span}-min run, minute ending "
             f"{iso(need_h.at_ms)})"))
    print(f"recommended: k {rec.k:g} (that + margin {args.margin:g}, at least 3), h "
          f"{rec.cusum_h:g} (that + margin {args.h_margin:g}, at least {MIN_H:g}); current "
          f"k {current.k:g}, h {current.cusum_h:g}")
    print(f"with it: {again.trips_outside} trips outside the incident"
          + ("" if incident else f", {sum(d.held_count for d in again.days.values())} held"))
    if incident is not None:
        for label, c in (("now", cal), ("recommended", again)):
            at = c.incident_trip_ms
            print(f"incident, {label}: " + ("never tripped" if at is None else
                  f"tripped at {iso(at)}, {(at - incident[0]) / 60_000:.0f} min after its "
                  "start"))

    def burst_tick(n: int, at: int) -> None:
        if not args.quiet:
            print(f"[calibrate] retrodated burst: {n:,} minutes (event time {iso(at)}), "
                  f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)

    retro = [(m, minutes[m][2]) for m in sorted(minutes) if minutes[m][2]]
    if not args.topic and retro and since // 60_000 < retro[0][0]:
        retro.insert(0, (since // 60_000, 0))  # the quiet minutes from --from on count too
    burst, burst_json = burst_report(
        retro,
        now_cfg.cfg.retro_burst, now_cfg.cfg.window_ms(ALL_ENDPOINTS), args.burst_margin,
        incident, burst_tick)
    if args.json:
        print_json({"current": asdict(cal.thresholds), "recommended": asdict(rec),
                    "needed": None if need is None else asdict(need),
                    "needed_h": None if need_h is None else asdict(need_h),
                    "days": [asdict(d) for d in cal.days.values()],
                    "incident_trip_ms": {"current": cal.incident_trip_ms,
                                         "recommended": again.incident_trip_ms},
                    "burst": burst_json})
    key = settings.anomaly_global_key
    writes: list[Write] = []
    if args.apply:
        writes.append(lambda conn: write_thresholds(conn, args, "global", key, rec, mode,
                                                    "the global scope follows it"))
    if args.apply_burst:  # with --apply, in the same transaction: both rows or neither
        writes.append(lambda conn: write_burst(conn, args, key, burst))
    if writes:
        return apply(settings, args, writes)
    if not args.apply:
        print("\n(not applied: --apply --actor YOU writes k and h, --apply-burst the "
              "burst_count; audited)")
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--scope", choices=("global", "endpoint"), default="global",
                    help="global: the global total (default); endpoint: every endpoint's own "
                    "detector, and k and h for the endpoints' default row ('*')")
    ap.add_argument("--top", type=int, default=10,
                    help="--scope endpoint: how many of the endpoints closest to tripping to "
                    "list (default 10)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--from-db", action="store_true",
                     help="the deliveries in PostgreSQL (the default)")
    src.add_argument("--topic", action="store_true",
                     help="deliveries.v1, records produced in the time range")
    src.add_argument("--file", help="a JSON-lines file of conversions (one per line; with "
                     "--scope endpoint, deliveries or conversions with an endpoint_id)")
    ap.add_argument("--from", dest="since",
                    help="start (epoch ms or ISO-8601 with an offset; default --days before --to)")
    ap.add_argument("--to", dest="until", help="end (default now)")
    ap.add_argument("--days", type=float, default=28.0,
                    help="history length when --from is not given (default 28)")
    ap.add_argument("--incident-start", help="a labelled incident's start (excluded from "
                    "the recommendation; its would-have-tripped time reported)")
    ap.add_argument("--incident-end", help="its end")
    ap.add_argument("--margin", type=float, default=0.5,
                    help="sigmas added to the highest score (default 0.5)")
    ap.add_argument("--h-margin", type=float, default=2.0,
                    help="added to the highest CUSUM statistic (default 2: e^2, about 7 times"
                    " the time between false trips)")
    ap.add_argument("--apply", action="store_true",
                    help="write the recommended k and h to the global value_rate row, or with "
                    "--scope endpoint the endpoints' default row (audited)")
    ap.add_argument("--burst-margin", type=float, default=0.5,
                    help="global scope: the retrodated burst's recommended burst_count is the "
                    "busiest span's count times 1 + this (default 0.5)")
    ap.add_argument("--apply-burst", action="store_true",
                    help="global scope: write the recommended burst_count to the global "
                    "retrodating row (audited; its mode kept, a new row off)")
    ap.add_argument("--actor", help="who you are (with --apply)")
    ap.add_argument("--note", type=note, help="why (with --apply; recorded in the audit log)")
    ap.add_argument("--json", action="store_true", help="also print the report as JSON")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
