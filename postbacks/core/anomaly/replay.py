"""Replay a stream of conversions or deliveries through the gate's rules, in one process.

``replay(events, config)`` evaluates every event exactly as the gate would — retrodating
guard per delivery, payout value rate per endpoint (``config.endpoint_for(app_id)`` for a
conversion; a DeliveryRecord brings its own endpoint) and global — with windows closed as
event time advances. It reports, by UTC day and reason:

- **signals**: what the detectors flagged under the configured modes (detect by default:
  the metrics a detect-only deployment would emit);
- **would hold**: an *enforce simulation* of the same modes (every armed detector set to
  enforce), where a trip halts its scope for the rest of the replay — nobody clears it, as
  nobody would in production without a human. ``trips`` lists when and why;
- **peak ratio** per day and scope kind: the highest window total / baseline among windows
  over their floor, i.e. the multiple that would have tripped (the headroom).

Pure: no I/O, no clock; event time drives everything. The hot path is plain ints and
dicts (~4 µs an event). One process sees everything, so the global total is a running sum
here; the gate's per-partition roll-up adds up to the same number. Events whose snapshot
carries ``config.label_key`` are tallied under its value (synthetic cohorts), others as
``normal``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast

from postbacks.core.anomaly.baseline import BaselinePolicy, SeasonalBaseline, add, empty
from postbacks.core.anomaly.detectors import (
    ENDPOINT_THRESHOLDS,
    GLOBAL_THRESHOLDS,
    RETRODATING_WINDOW_MS,
    MissingInputs,
    RateResult,
    RateThresholds,
    payout_input,
    retrodated,
    value_rate,
)
from postbacks.core.anomaly.modes import (
    DELIVER,
    GateModes,
    HaltState,
    Hold,
    Mode,
    Scope,
    Trip,
    apply_trips,
    decide,
)
from postbacks.core.anomaly.windows import DAY_MS
from postbacks.records import ConversionEvent, DeliveryRecord

__all__ = [
    "DELIVERED",
    "NORMAL",
    "ReplayConfig",
    "Report",
    "Tally",
    "TripAt",
    "first_endpoint",
    "replay",
    "utc_date",
]

_DETECT_ALL = GateModes(Mode.DETECT, Mode.DETECT, Mode.DETECT)
NORMAL = "normal"  # the label of unlabelled events
DELIVERED = "delivered"  # the outcome of a delivered event (else: its hold reason)
_INF = float("inf")


def first_endpoint(app_id: str) -> str:
    """``app_<ns>_NNNN`` -> ``ep_<ns>_NNNN_1``: an app's first endpoint, as seeding names it."""
    return f"ep_{app_id.removeprefix('app_')}_1"


def utc_date(day_index: int) -> str:
    """Days since 1970-01-01 -> ``YYYY-MM-DD``."""
    return datetime.fromtimestamp(day_index * 86_400, UTC).date().isoformat()


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    modes: GateModes = _DETECT_ALL
    retrodating_window_ms: int = RETRODATING_WINDOW_MS
    endpoint_thresholds: RateThresholds = ENDPOINT_THRESHOLDS
    global_thresholds: RateThresholds = GLOBAL_THRESHOLDS
    policy: BaselinePolicy = field(default_factory=BaselinePolicy)
    progress_every: int = 250_000
    endpoint_for: Callable[[str], str] = first_endpoint  # app_id -> endpoint of a conversion
    label_key: str = "synthetic_cohort"  # snapshot key whose value labels an event's cohort


@dataclass(frozen=True, slots=True)
class TripAt:
    at_ms: int  # event time of the delivery that tripped the scope
    trip: Trip


Tally = tuple[int, int]  # (count, payout micros)


@dataclass(frozen=True, slots=True)
class Report:
    config: ReplayConfig
    events: int
    payout_micros: int
    first_ms: int | None
    last_ms: int | None
    by_day: dict[str, Tally]
    signals: dict[tuple[str, str], Tally]  # (day, reason) under the configured modes
    would_hold: dict[tuple[str, str], Tally]  # (day, reason) in the enforce simulation
    trips: tuple[TripAt, ...]
    first_hold_ms: int | None
    cohorts: dict[tuple[str, bool, str], Tally]  # (cohort, retrodated, outcome)
    cohort_first_ms: dict[str, int]
    # (day, "endpoint" | "global") -> highest total/baseline of a window over its floor:
    # the multiple that would have tripped it (the headroom of the configured multiple).
    peak_ratio: dict[tuple[str, str], float]


def _bump(d: dict[tuple[int, str], list[int]], key: tuple[int, str], micros: int) -> None:
    t = d.get(key)
    if t is None:
        d[key] = [1, micros]
    else:
        t[0] += 1
        t[1] += micros


def replay(events: Iterable[ConversionEvent | DeliveryRecord],
           config: ReplayConfig | None = None,
           progress: Callable[[int, int], None] | None = None) -> Report:
    """Evaluate every event; ``progress(n, event_time_ms)`` every ``progress_every``."""
    cfg = config or ReplayConfig()
    m = cfg.modes
    sim = GateModes(*(Mode.OFF if x is Mode.OFF else Mode.ENFORCE
                      for x in (m.retrodating, m.endpoint_rate, m.global_rate)))
    blank = empty(cfg.policy)
    ep_th, g_th, win = cfg.endpoint_thresholds, cfg.global_thresholds, cfg.retrodating_window_ms
    every = max(1, cfg.progress_every)
    endpoint_for, label_key = cfg.endpoint_for, cfg.label_key
    states: dict[str, SeasonalBaseline] = {}
    g = blank
    endpoints: dict[str, str] = {}
    halts: dict[Scope, HaltState] = {}
    by_day: dict[int, list[int]] = {}
    signals: dict[tuple[int, str], list[int]] = {}
    holds: dict[tuple[int, str], list[int]] = {}
    cohorts: dict[tuple[str, bool, str], list[int]] = {}
    cohort_first: dict[str, int] = {}
    trips: list[TripAt] = []
    peak_ep: dict[int, float] = {}
    peak_g: dict[int, float] = {}
    ep_floor, g_floor = ep_th.floor_micros, g_th.floor_micros
    first_ms: int | None = None
    last_ms = 0
    first_hold: int | None = None
    n = total = 0
    for ev in events:
        n += 1
        if "conversion" in ev:
            dlv = cast(DeliveryRecord, ev)
            conv, ep = dlv["conversion"], dlv["endpoint_id"]
        else:
            conv = ev
            app = conv["app_id"]
            ep = endpoints.get(app) or endpoints.setdefault(app, endpoint_for(app))
        ts = conv["occurred_at"]
        if first_ms is None:
            first_ms = ts
        last_ms = ts
        day = ts // DAY_MS
        retro = retrodated(conv["source_created_at"], conv["source_completed_at"], win)
        pay = conv["payout_usd_micros"]
        micros = pay if type(pay) is int and pay >= 0 else payout_input(pay)
        ep_rate: RateResult | MissingInputs
        g_rate: RateResult | MissingInputs
        if isinstance(micros, MissingInputs):
            ep_rate = g_rate = micros
            micros = 0
        else:
            st = add(states.get(ep, blank), ts, micros)
            states[ep] = st
            ep_rate = value_rate(st, ep_th)
            g = add(g, ts, micros)
            g_rate = value_rate(g, g_th)
            b = st.open_baseline
            if b is not None and st.open_total > ep_floor:
                r = st.open_total / b if b else _INF
                if r > peak_ep.get(day, 0.0):
                    peak_ep[day] = r
            b = g.open_baseline
            if b is not None and g.open_total > g_floor:
                r = g.open_total / b if b else _INF
                if r > peak_g.get(day, 0.0):
                    peak_g[day] = r
        total += micros
        t = by_day.get(day)
        if t is None:
            by_day[day] = [1, micros]
        else:
            t[0] += 1
            t[1] += micros
        d = decide(ep, sim, retro, ep_rate, g_rate, halts)
        outcome = DELIVERED
        if d is not DELIVER:
            for s in d.metrics:
                _bump(signals, (day, s.reason), micros)
            if isinstance(d, Hold):
                outcome = d.reason
                _bump(holds, (day, d.reason), micros)
                if first_hold is None:
                    first_hold = ts
                if d.trips:
                    halts = apply_trips(halts, d.trips)
                    trips.extend(TripAt(ts, tr) for tr in d.trips)
        cohort = conv["source_snapshot"].get(label_key, NORMAL)
        if cohort != NORMAL and cohort not in cohort_first:
            cohort_first[cohort] = ts
        ck = (cohort, retro is True, outcome)
        c = cohorts.get(ck)
        if c is None:
            cohorts[ck] = [1, micros]
        else:
            c[0] += 1
            c[1] += micros
        if progress is not None and n % every == 0:
            progress(n, ts)
    return Report(
        config=cfg, events=n, payout_micros=total, first_ms=first_ms,
        last_ms=last_ms if n else None,
        by_day={utc_date(k): (v[0], v[1]) for k, v in sorted(by_day.items())},
        signals={(utc_date(k[0]), k[1]): (v[0], v[1]) for k, v in sorted(signals.items())},
        would_hold={(utc_date(k[0]), k[1]): (v[0], v[1]) for k, v in sorted(holds.items())},
        trips=tuple(trips), first_hold_ms=first_hold,
        cohorts={k: (v[0], v[1]) for k, v in sorted(cohorts.items())},
        cohort_first_ms=cohort_first,
        peak_ratio={(utc_date(k), kind): v for kind, peaks in (("endpoint", peak_ep),
                                                           ("global", peak_g))
                    for k, v in sorted(peaks.items())},
    )
