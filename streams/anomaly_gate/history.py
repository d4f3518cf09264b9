"""Synthetic conversion history for calibrating the anomaly gate.

Deterministic from the RNG passed in, lazy (an iterator, event-time ordered), so four weeks
of ~1.5 M events stream in constant memory. Traffic has a diurnal shape (peak 15:00 UTC,
trough 03:00 at 40% of the mean), a weekly shape (quieter weekends), a small per-day
jitter, and a Zipf-skewed volume over ``apps`` apps (``app_<ns>_NNNN``, each with one
endpoint ``ep_<ns>_NNNN_1`` as ``seed_endpoints`` names them). Payouts come from a fixed
heavy-tailed table (mean ~$2.09). Normal completions precede creation by minutes (never
more than 3 days), so the retrodating guard must not fire on them.

Injectable cohorts add events on top of the normal traffic, each marked with
``source_snapshot["synthetic_cohort"]`` so a replay can score them:

- ``retrodated``: events whose completion is weeks before creation;
- ``concentrated``: one endpoint's payout x ``factor`` for some hours;
- ``broad_shallow``: ~40 endpoints (volume-weighted pick) each +40-60% of their normal
  payout for some hours, ~29% of the cohort retrodated — the IR-307 shape.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import orjson

from postbacks.core.anomaly.windows import DAY_MS, HOUR_MS, day_of_week, hour_of_day
from postbacks.records import ConversionEvent
from postbacks.tools.seed import app_id_for

__all__ = [
    "COHORT_KEY",
    "COHORT_KINDS",
    "DEFAULT_RATE_PER_S",
    "START_MS",
    "BroadShallow",
    "Cohort",
    "Concentrated",
    "HistoryConfig",
    "Retrodated",
    "cohort_named",
    "endpoint_for_app",
    "generate",
    "main",
    "read_jsonl",
    "seasonality",
    "write_jsonl",
]


def endpoint_for_app(app_id: str) -> str:
    """``app_<ns>_NNNN`` -> ``ep_<ns>_NNNN_1``: an app's first endpoint, as seeding names it."""
    return f"ep_{app_id.removeprefix('app_')}_1"

DEFAULT_RATE_PER_S = 0.62  # ~1.5 M events in four weeks
START_MS = 1_772_409_600_000  # 2026-03-02T00:00:00Z, a Monday
COHORT_KEY = "synthetic_cohort"
_WEEKLY = (1.05, 1.05, 1.05, 1.05, 1.10, 0.85, 0.85)  # Mon..Sun, mean 1
# 64 equally likely payouts (micros): mean ~$2.09, a tail up to $20.
_PAYOUTS = ((250_000,) * 20 + (1_000_000,) * 16 + (2_000_000,) * 12 + (3_000_000,) * 8
            + (5_000_000,) * 5 + (10_000_000,) * 2 + (20_000_000,))
_MAX_NORMAL_AGE_MS = 3 * DAY_MS


@dataclass(frozen=True, slots=True)
class Retrodated:
    """Extra events, all completed ``min_days``-``max_days`` before their creation."""

    start_hour: int
    hours: int = 6
    per_hour: float = 60.0
    min_days: float = 8.0
    max_days: float = 45.0
    name: str = "retrodated"


@dataclass(frozen=True, slots=True)
class Concentrated:
    """The ``rank``-th largest endpoint's payout multiplied by ``factor``."""

    start_hour: int
    hours: int = 6
    factor: float = 10.0
    rank: int = 3
    name: str = "concentrated"


@dataclass(frozen=True, slots=True)
class BroadShallow:
    """``endpoints`` endpoints each +``extra_low``..``extra_high`` of their normal payout."""

    start_hour: int
    hours: int = 24
    endpoints: int = 40
    extra_low: float = 0.4
    extra_high: float = 0.6
    retrodated_share: float = 0.29
    min_days: float = 8.0
    max_days: float = 45.0
    name: str = "broad_shallow"


Cohort = Retrodated | Concentrated | BroadShallow
COHORT_KINDS = ("retrodated", "concentrated", "broad_shallow")


def cohort_named(name: str, start_hour: int) -> Cohort:
    """A cohort with its default shape, starting ``start_hour`` hours into the history."""
    match name:
        case "retrodated":
            return Retrodated(start_hour)
        case "concentrated":
            return Concentrated(start_hour)
        case "broad_shallow":
            return BroadShallow(start_hour)
    raise ValueError(f"unknown cohort {name!r} (known: {', '.join(COHORT_KINDS)})")


@dataclass(frozen=True, slots=True)
class HistoryConfig:
    """``weeks`` of normal traffic, then normal traffic continues while cohorts last."""

    weeks: int = 4
    apps: int = 120
    mean_rate_per_s: float = DEFAULT_RATE_PER_S
    start_ms: int = START_MS
    namespace: str = "cal"
    skew: float = 1.1  # Zipf exponent of app volume
    day_jitter: float = 0.03  # each day's volume x U(1 - j, 1 + j)
    cohorts: tuple[Cohort, ...] = ()

    @property
    def hours(self) -> int:
        end = max((c.start_hour + c.hours for c in self.cohorts), default=0)
        return max(self.weeks * 168, end)


def seasonality(ts_ms: int) -> float:
    """Diurnal x weekly volume multiplier at ``ts_ms`` (mean 1 over a week)."""
    diurnal = 1.0 + 0.6 * math.cos(2 * math.pi * (hour_of_day(ts_ms) - 15) / 24)
    return diurnal * _WEEKLY[day_of_week(ts_ms)]


def poisson(rng: random.Random, lam: float, gauss_above: float = 50.0) -> int:
    """A Poisson draw with mean ``lam``: Knuth's product of uniforms, or a rounded normal
    above ``gauss_above`` (the product's cost grows with ``lam``). The generators that share
    it keep their own cut-over: it decides which draws a seed gives."""
    if lam <= 0:
        return 0
    if lam > gauss_above:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def _pick_weighted(rng: random.Random, weights: Sequence[float], k: int) -> list[int]:
    """``k`` distinct indices, volume-weighted (Efraimidis-Spirakis keys)."""
    keys = sorted(range(len(weights)), key=lambda i: rng.random() ** (1 / weights[i]))
    return sorted(keys[-k:])


@dataclass(frozen=True, slots=True)
class _Plan:
    cohort: Cohort
    apps: list[int]
    cum: list[float]
    per_hour: float  # before seasonality
    seasonal: bool
    retro_share: float
    retro_ms: tuple[int, int]


def _plan(c: Cohort, rng: random.Random, weights: list[float], per_hour: float) -> _Plan:
    match c:
        case BroadShallow():
            idx = _pick_weighted(rng, weights, min(c.endpoints, len(weights)))
            extra = [rng.uniform(c.extra_low, c.extra_high) for _ in idx]
            w = [weights[i] * f for i, f in zip(idx, extra, strict=True)]
            return _Plan(c, idx, _cumulate(w), sum(w) * per_hour, True, c.retrodated_share,
                         (int(c.min_days * DAY_MS), int(c.max_days * DAY_MS)))
        case Concentrated():
            i = min(c.rank, len(weights)) - 1
            return _Plan(c, [i], [1.0], (c.factor - 1) * weights[i] * per_hour, True, 0.0,
                         (0, 0))
        case Retrodated():
            return _Plan(c, list(range(len(weights))), _cumulate(weights), c.per_hour, False,
                         1.0, (int(c.min_days * DAY_MS), int(c.max_days * DAY_MS)))


def generate(config: HistoryConfig, rng: random.Random) -> Iterator[ConversionEvent]:
    """Yield the history in event-time order (sorted within each hour)."""
    ns = config.namespace
    apps = [app_id_for(ns, i + 1) for i in range(config.apps)]
    raw = [1 / (i + 1) ** config.skew for i in range(config.apps)]
    weights = [w / sum(raw) for w in raw]
    cum = _cumulate(weights)
    per_hour = config.mean_rate_per_s * 3600
    # Cohort setup is drawn before any event: it does not depend on the history length.
    plans = [_plan(c, rng, weights, per_hour) for c in config.cohorts]
    app_range = range(config.apps)
    day_factor = 1.0
    seq = 0
    prefix = f"{ns}_{config.start_ms // 1000}"
    getrandbits, rand, log = rng.getrandbits, rng.random, math.log
    amounts = {p: f"{p / 1e6:.2f}" for p in set(_PAYOUTS)}
    for h in range(config.hours):
        t0 = config.start_ms + h * HOUR_MS
        if h % 24 == 0:
            day_factor = 1 + rng.uniform(-config.day_jitter, config.day_jitter)
        season = seasonality(t0) * day_factor
        n = poisson(rng, per_hour * season)
        batch = [(int(rand() * HOUR_MS), a, -1, False)
                 for a in rng.choices(app_range, cum_weights=cum, k=n)]
        for ci, p in enumerate(plans):
            if p.cohort.start_hour <= h < p.cohort.start_hour + p.cohort.hours:
                k = poisson(rng, p.per_hour * (season if p.seasonal else 1.0))
                batch.extend((int(rand() * HOUR_MS), a, ci, rand() < p.retro_share)
                             for a in rng.choices(p.apps, cum_weights=p.cum, k=k))
        batch.sort()
        for off, a, ci, retro in batch:
            seq += 1
            ts = t0 + off
            bits = getrandbits(52)  # 12 creation lag (ms) | 6 payout | 24 player | 10 offer
            created = ts - (bits & 0xFFF)
            if retro:
                lo, hi = plans[ci].retro_ms
                age = lo + int((hi - lo) * rand())
            else:  # exponential, mean 30 min, at most 3 days
                age = min(int(-log(1.0 - rand()) * 1_800_000), _MAX_NORMAL_AGE_MS) + 1_000
            payout = _PAYOUTS[(bits >> 12) & 63]
            snapshot = {"player_id": f"p{(bits >> 18) & 0xFFFFFF}",
                        "offer_id": str(bits >> 42), "amount": amounts[payout],
                        "currency": "USD"}
            if ci >= 0:
                snapshot[COHORT_KEY] = plans[ci].cohort.name
            yield {
                "event_id": f"evt_{prefix}_{seq:010d}",
                "conversion_id": f"cv_{prefix}_{seq:010d}",
                "app_id": apps[a], "event_type": "conversion", "goal_id": None,
                "payout_usd_micros": payout, "source_created_at": created,
                "source_completed_at": created - age, "occurred_at": ts,
                "source_snapshot": snapshot, "original_amount": None,
                "original_currency": None, "producer": "postbacks-history",
            }


def _cumulate(weights: Sequence[float]) -> list[float]:
    out, acc = [], 0.0
    for w in weights:
        acc += w
        out.append(acc)
    return out


def write_jsonl(events: Iterable[ConversionEvent], path: Path | str) -> int:
    """Write one JSON object per line; returns the number written."""
    n = 0
    with open(path, "wb") as f:
        for ev in events:
            f.write(orjson.dumps(ev))
            f.write(b"\n")
            n += 1
    return n


def read_jsonl(path: Path | str) -> Iterator[ConversionEvent]:
    """Lazily read a file written by :func:`write_jsonl` (blank lines skipped)."""
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield cast(ConversionEvent, orjson.loads(line))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m streams.anomaly_gate.history",
        description="Write a synthetic, seasonal conversion history as JSON lines.")
    ap.add_argument("--out", required=True, help="output .jsonl file")
    ap.add_argument("--weeks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--apps", type=int, default=120)
    ap.add_argument("--rate", type=float, default=DEFAULT_RATE_PER_S, help="mean events per second")
    ap.add_argument("--namespace", default="cal")
    ap.add_argument("--inject", action="append", default=[], choices=COHORT_KINDS,
                    help="add a cohort starting at 09:00 on the Monday after the weeks")
    args = ap.parse_args(argv)
    start = args.weeks * 168 + 9
    cfg = HistoryConfig(weeks=args.weeks, apps=args.apps, mean_rate_per_s=args.rate,
                        namespace=args.namespace,
                        cohorts=tuple(cohort_named(n, start) for n in args.inject))
    n = write_jsonl(generate(cfg, random.Random(args.seed)), args.out)
    print(f"wrote {n} events to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
