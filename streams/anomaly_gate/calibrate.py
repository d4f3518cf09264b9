"""Calibration: replay a history (a JSON-lines file or a generated one) through the
anomaly detectors in detect mode and report would-have-held counts and payout by scope,
detector and day; and the issue's scenario as a callable for tests and benchmarks.

The replay itself is :func:`postbacks.core.anomaly.replay.replay` (pure); this module adds
the synthetic-history wiring, the plain-text/JSON report and the command line.
Events marked ``source_snapshot["synthetic_cohort"]`` (``tools.history``) are scored
separately, which is what :func:`run_scenario` uses for detection delay and leaked payout.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from postbacks.core.anomaly.baseline import BaselinePolicy
from postbacks.core.anomaly.detectors import ENDPOINT_THRESHOLDS, GLOBAL_THRESHOLDS, RateThresholds
from postbacks.core.anomaly.modes import GLOBAL_SCOPE, GateModes, Mode
from postbacks.core.anomaly.replay import (
    DELIVERED,
    NORMAL,
    ReplayConfig,
    Report,
    TripAt,
    replay,
    utc_date,
)
from postbacks.core.anomaly.windows import DAY_MS
from postbacks.records import ConversionEvent
from streams.anomaly_gate.history import (
    COHORT_KEY,
    COHORT_KINDS,
    DEFAULT_RATE_PER_S,
    BroadShallow,
    HistoryConfig,
    cohort_named,
    endpoint_for_app,
    generate,
    read_jsonl,
)

__all__ = [
    "ReplayConfig",
    "Report",
    "ScenarioResult",
    "TripAt",
    "format_report",
    "main",
    "replay",
    "run_scenario",
]


def _config(**kw: Any) -> ReplayConfig:
    """A replay configuration wired to the synthetic history's naming and cohort marker."""
    return ReplayConfig(endpoint_for=endpoint_for_app, label_key=COHORT_KEY, **kw)


# -- the IR-307 scenario -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """Four normal weeks, then a broad-but-shallow cohort, replayed under enforce."""

    events: int
    cohort_events: int
    cohort_retrodated: int
    cohort_retrodated_held: int
    cohort_start_ms: int
    global_trip_ms: int | None
    endpoint_trips: int
    detection_delay_s: float | None  # event time, cohort start -> global trip
    leaked_payout_micros: int  # cohort payout delivered (all of it before the global trip)
    leaked_events: int
    cohort_payout_micros: int
    false_positive_holds: int  # holds during the normal weeks
    report: Report


def run_scenario(*, weeks: int = 4, seed: int = 1, rate_per_s: float = DEFAULT_RATE_PER_S,
                 apps: int = 120, cohort_hours: int = 24) -> ScenarioResult:
    """Generate and replay the scenario with every detector in enforce.

    The cohort starts at 09:00 UTC on the Monday after ``weeks`` normal weeks. At a rate
    other than the default the *global* floor scales with it (it is a fraction of normal
    peak volume); the endpoint floor does not (it guards against small-count noise).
    """
    cohort = BroadShallow(start_hour=weeks * 168 + 9, hours=cohort_hours)
    hist = HistoryConfig(weeks=weeks, apps=apps, mean_rate_per_s=rate_per_s, cohorts=(cohort,))
    cfg = _config(
        modes=GateModes(Mode.ENFORCE, Mode.ENFORCE, Mode.ENFORCE),
        global_thresholds=RateThresholds(
            GLOBAL_THRESHOLDS.multiple,
            int(GLOBAL_THRESHOLDS.floor_micros * rate_per_s / DEFAULT_RATE_PER_S)),
    )
    rep = replay(generate(hist, random.Random(seed)), cfg)
    start = rep.cohort_first_ms.get(cohort.name, 0)
    mine = {k: v for k, v in rep.cohorts.items() if k[0] == cohort.name}
    gtrip = next((t.at_ms for t in rep.trips if (t.trip.scope, t.trip.key) == GLOBAL_SCOPE),
                 None)
    # The normal weeks are the days before the cohort's day (it starts on a Monday).
    fp = sum(c for (day, _), (c, _) in rep.would_hold.items() if day < utc_date(start // DAY_MS))
    leaked = [v for (_, _, out), v in mine.items() if out == DELIVERED]
    return ScenarioResult(
        events=rep.events,
        cohort_events=sum(c for c, _ in mine.values()),
        cohort_retrodated=sum(c for (_, r, _), (c, _) in mine.items() if r),
        cohort_retrodated_held=sum(c for (_, r, out), (c, _) in mine.items()
                                   if r and out != DELIVERED),
        cohort_start_ms=start,
        global_trip_ms=gtrip,
        endpoint_trips=sum(1 for t in rep.trips if t.trip.scope == "endpoint"),
        detection_delay_s=None if gtrip is None else (gtrip - start) / 1000,
        leaked_payout_micros=sum(p for _, p in leaked),
        leaked_events=sum(c for c, _ in leaked),
        cohort_payout_micros=sum(p for _, p in mine.values()),
        false_positive_holds=fp,
        report=rep,
    )


# -- output --------------------------------------------------------------------------------


def _usd(micros: float) -> str:
    return f"${micros / 1e6:,.2f}"


def _ts(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def format_report(rep: Report) -> str:
    """A plain-text table: per day, signals and would-hold by reason; trips; cohorts."""
    c, m = rep.config, rep.config.modes
    lines = [
        f"events {rep.events:,}  payout {_usd(rep.payout_micros)}"
        + (f"  {_ts(rep.first_ms)} .. {_ts(rep.last_ms)}"
           if rep.first_ms is not None and rep.last_ms is not None else ""),
        f"window {c.policy.window_ms // 60_000} min; baseline = median of the same slot over "
        f"{c.policy.weeks} weeks (min {c.policy.min_weeks}); retrodated > "
        f"{c.retrodating_window_ms / DAY_MS:g} d",
        f"thresholds: endpoint x{c.endpoint_thresholds.multiple:g} and > "
        f"{_usd(c.endpoint_thresholds.floor_micros)}; global x{c.global_thresholds.multiple:g}"
        f" and > {_usd(c.global_thresholds.floor_micros)}",
        f"modes: retrodating={m.retrodating} endpoint_rate={m.endpoint_rate} "
        f"global_rate={m.global_rate}; 'hold' = enforce simulation, trips never cleared",
        "",
        "peak = highest window total / baseline among windows over the floor "
        "(endpoint, global)",
        "",
        f"{'day':<11}{'events':>9}{'payout':>15}{'peak ep':>9}{'peak gl':>9}  "
        f"{'reason':<23}{'signals':>9}{'sig. payout':>14}{'hold':>9}{'hold payout':>15}",
    ]
    for day, (n, pay) in rep.by_day.items():
        reasons = sorted({r for d, r in rep.signals if d == day}
                         | {r for d, r in rep.would_hold if d == day})
        pe = rep.peak_ratio.get((day, "endpoint"))
        pg = rep.peak_ratio.get((day, "global"))
        head = (f"{day:<11}{n:>9,}{_usd(pay):>15}{'-' if pe is None else f'{pe:.2f}':>9}"
                f"{'-' if pg is None else f'{pg:.2f}':>9}  ")
        if not reasons:
            lines.append(head + "-")
        for i, r in enumerate(reasons):
            sn, sp = rep.signals.get((day, r), (0, 0))
            hn, hp = rep.would_hold.get((day, r), (0, 0))
            lines.append((head if i == 0 else " " * len(head))
                         + f"{r:<23}{sn:>9,}{_usd(sp):>14}{hn:>9,}{_usd(hp):>15}")
    lines.append("")
    lines.append(f"trips ({len(rep.trips)}):" if rep.trips else "trips: none")
    for t in rep.trips[:50]:
        tr = t.trip
        lines.append(f"  {_ts(t.at_ms)}  {tr.scope}:{tr.key} {tr.detector} observed "
                     f"{_usd(tr.observed)} baseline {_usd(tr.baseline)} "
                     f"(window {_ts(tr.window_start_ms)[11:16]})")
    if len(rep.trips) > 50:
        lines.append(f"  ... {len(rep.trips) - 50} more")
    marked = [k for k in rep.cohorts if k[0] != NORMAL]
    if marked:
        lines.append("")
        lines.append("cohorts (cohort, retrodated, outcome: count, payout):")
        for k in marked:
            n, pay = rep.cohorts[k]
            first = rep.cohort_first_ms[k[0]]
            lines.append(f"  {k[0]:<14} {'retrodated' if k[1] else 'fresh':<11} {k[2]:<22}"
                         f"{n:>8,} {_usd(pay):>14}   (first event {_ts(first)})")
    return "\n".join(lines)


def _rows(table: Mapping[Any, Any], *names: str) -> list[dict[str, Any]]:
    """``{(k1, k2): (v1, v2)}`` -> ``[{name: k1, ...: v2}]`` for JSON."""
    return [dict(zip(names, (*(k if isinstance(k, tuple) else (k,)),
                             *(v if isinstance(v, tuple) else (v,))), strict=True))
            for k, v in table.items()]


def _to_json(rep: Report) -> bytes:
    doc = {
        "events": rep.events, "payout_micros": rep.payout_micros, "first_ms": rep.first_ms,
        "last_ms": rep.last_ms, "cohort_first_ms": rep.cohort_first_ms,
        "by_day": _rows(rep.by_day, "day", "events", "payout_micros"),
        "signals": _rows(rep.signals, "day", "reason", "count", "payout_micros"),
        "would_hold": _rows(rep.would_hold, "day", "reason", "count", "payout_micros"),
        "trips": [{"at_ms": t.at_ms, **asdict(t.trip)} for t in rep.trips],
        "cohorts": _rows(rep.cohorts, "cohort", "retrodated", "outcome", "count",
                         "payout_micros"),
        "peak_ratio": _rows(rep.peak_ratio, "day", "scope", "ratio"),
    }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m streams.anomaly_gate.calibrate",
        description="Replay a conversion history through the anomaly detectors (detect "
                    "mode) and report would-have-held counts and payout by scope, detector "
                    "and day.")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", type=Path, help="a JSON-lines history (tools.history)")
    src.add_argument("--generate", action="store_true", help="generate a synthetic history")
    ap.add_argument("--weeks", type=int, default=4, help="with --generate (default 4)")
    ap.add_argument("--seed", type=int, default=1, help="with --generate (default 1)")
    ap.add_argument("--apps", type=int, default=120, help="with --generate (default 120)")
    ap.add_argument("--rate", type=float, default=DEFAULT_RATE_PER_S,
                    help=f"with --generate: mean events/s (default {DEFAULT_RATE_PER_S}, "
                         "~1.5 M events in 4 weeks)")
    ap.add_argument("--inject", action="append", default=[], choices=COHORT_KINDS,
                    help="with --generate: add a cohort at 09:00 on the Monday after the "
                         "weeks (repeatable)")
    ap.add_argument("--mode", choices=[str(x) for x in Mode], default="detect",
                    help="mode of every detector (default detect)")
    for flag, kind, default in [
        ("window-minutes", int, 60), ("baseline-weeks", int, 4), ("min-weeks", int, 2),
        ("retrodating-days", float, 7.0),
        ("endpoint-multiple", float, ENDPOINT_THRESHOLDS.multiple),
        ("endpoint-floor-usd", float, ENDPOINT_THRESHOLDS.floor_micros / 1e6),
        ("global-multiple", float, GLOBAL_THRESHOLDS.multiple),
        ("global-floor-usd", float, GLOBAL_THRESHOLDS.floor_micros / 1e6),
    ]:
        ap.add_argument(f"--{flag}", type=kind, default=default, help=f"default {default:g}")
    ap.add_argument("--json", type=Path, help="also write the report as JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = ap.parse_args(argv)
    mode = Mode(args.mode)
    try:
        cfg = _config(
            modes=GateModes(mode, mode, mode),
            retrodating_window_ms=int(args.retrodating_days * DAY_MS),
            endpoint_thresholds=RateThresholds(args.endpoint_multiple,
                                               int(args.endpoint_floor_usd * 1e6)),
            global_thresholds=RateThresholds(args.global_multiple,
                                             int(args.global_floor_usd * 1e6)),
            policy=BaselinePolicy(args.window_minutes * 60_000, args.baseline_weeks,
                                  args.min_weeks),
        )
    except ValueError as e:
        ap.error(str(e))
    if args.generate:
        start = args.weeks * 168 + 9
        hist = HistoryConfig(weeks=args.weeks, apps=args.apps, mean_rate_per_s=args.rate,
                             cohorts=tuple(cohort_named(n, start) for n in args.inject))
        events: Iterable[ConversionEvent] = generate(hist, random.Random(args.seed))
    else:
        events = read_jsonl(args.file)
    t0 = time.perf_counter()

    def progress(n: int, ts: int) -> None:
        dt = time.perf_counter() - t0
        print(f"[calibrate] {n:,} events (event time {_ts(ts)}) {dt:.1f}s {n / dt:,.0f}/s",
              file=sys.stderr, flush=True)

    rep = replay(events, cfg, None if args.quiet else progress)
    dt = time.perf_counter() - t0
    print(format_report(rep))
    what = "generate + replay" if args.generate else "read + replay"
    print(f"\n{what}: {rep.events:,} events in {dt:.2f}s "
          f"({rep.events / dt if dt else 0:,.0f} events/s)")
    if args.json:
        args.json.write_bytes(_to_json(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
