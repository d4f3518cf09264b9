"""Containment benchmarks' traffic generator (bench/containment_core.py in process,
bench/containment.py through Kafka): per-minute seasonal traffic for ``--apps`` endpoints,
Zipf-skewed volumes, each endpoint its own lognormal payout, a diurnal and weekly shape, a
per-day and a per-hour level, and minute counts over-dispersed beyond Poisson."""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.containment_endpoints import Endpoints, Minute
from streams.anomaly_gate.history import poisson

MIN_MS = 60_000
START_MS = 1_772_409_600_000  # 2026-03-02T00:00:00Z, a Monday
WEEKLY = (1.05, 1.05, 1.05, 1.05, 1.10, 0.85, 0.85)  # Mon..Sun
POOL = 1 << 18
TAIL_H = 48 + 40  # minutes generated after the normal weeks: the control's span


@dataclass(frozen=True, slots=True)
class Traffic:
    minutes: list[int]  # normal payout per minute (micros), from START_MS
    counts: list[int]
    expected: list[float]  # the generator's own mean value per minute (noise-free)
    weights: list[float]  # endpoint volume shares
    means: list[float]  # endpoint mean payouts (micros)
    normal_weeks_from: int  # first minute of the normal weeks (after the warm-up)
    tail_from: int  # first minute after the normal weeks


def seasonal(minute: int) -> float:
    hours = minute / 60
    diurnal = 1.0 + 0.6 * math.cos(2 * math.pi * ((hours % 24) - 15) / 24)
    return diurnal * WEEKLY[int(hours // 24) % 7]


def _poisson(rng: random.Random, lam: float) -> int:
    return poisson(rng, lam, gauss_above=40.0)


def _endpoint_pool(rng: random.Random, weights: list[float], means: list[float],
                   members: list[int], sigma: float) -> tuple[list[int], list[int]]:
    """Payouts drawn volume-weighted from ``members``' own lognormal distributions, and
    the endpoint of each."""
    w = [weights[i] for i in members]
    picks = rng.choices(members, weights=w, k=POOL)
    mu = -sigma * sigma / 2
    return [max(10_000, round(means[i] * rng.lognormvariate(mu, sigma))) for i in picks], picks


def _per_endpoint(idx: list[int], pool: list[int], eps: list[int]) -> Minute:
    out: dict[int, list[int]] = {}
    for i in idx:
        t = out.get(eps[i])
        if t is None:
            out[eps[i]] = [pool[i], 1]
        else:
            t[0] += pool[i]
            t[1] += 1
    return {ep: (v, n) for ep, (v, n) in out.items()}


Sink = Callable[[int, list[int], list[int], list[int]], None]
"""Called per generated minute with (minute, pool indices drawn, payout pool, endpoint of
each pool entry): the individual conversions behind the minute's totals."""


def generate(args: argparse.Namespace, seed: int, eps: Endpoints | None = None,
             sink: Sink | None = None) -> Traffic:
    rng = random.Random(seed)
    raw = [1 / (i + 1) ** args.zipf for i in range(args.apps)]
    weights = [x / sum(raw) for x in raw]
    rng.shuffle(weights)
    means = [2_000_000 * rng.lognormvariate(0, 0.7) for _ in range(args.apps)]
    pool, pool_ep = _endpoint_pool(rng, weights, means, list(range(args.apps)),
                                   args.payout_sigma)
    indices = range(POOL)
    mean_pay = sum(w * m for w, m in zip(weights, means, strict=True))
    n_min = args.weeks * 7 * 1440 + TAIL_H * 60
    shape = 1 / (args.minute_cv ** 2)
    minutes, counts, expected = [], [], []
    day_level = hour_level = 1.0
    choices, gamma = rng.choices, rng.gammavariate
    for m in range(n_min):
        if m % 1440 == 0:
            day_level = rng.lognormvariate(0, args.day_sd)
        if m % 60 == 0:
            hour_level = rng.lognormvariate(0, args.hour_sd)
        lam = args.rate * seasonal(m)
        expected.append(lam * mean_pay)
        n = _poisson(rng, lam * day_level * hour_level * gamma(shape, 1 / shape))
        counts.append(n)
        if eps is None and sink is None:
            minutes.append(sum(choices(pool, k=n)) if n else 0)
            continue
        idx = choices(indices, k=n)  # the same draws as choices(pool, k=n)
        minutes.append(sum(pool[i] for i in idx))
        if eps is not None:
            eps.minute(m, _per_endpoint(idx, pool, pool_ep))
        if sink is not None:
            sink(m, idx, pool, pool_ep)
    warm = args.warmup * 7 * 1440
    return Traffic(minutes, counts, expected, weights, means, warm, args.weeks * 7 * 1440)


def traffic_args(ap: argparse.ArgumentParser, apps: int = 150, rate: float = 120.0) -> None:
    """The generator's flags (shared with bench/containment.py)."""
    ap.add_argument("--apps", type=int, default=apps, help="endpoints (one app each)")
    ap.add_argument("--rate", type=float, default=rate, help="mean conversions per minute")
    ap.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of volume")
    ap.add_argument("--payout-sigma", type=float, default=0.9, help="lognormal sigma")
    ap.add_argument("--day-sd", type=float, default=0.03)
    ap.add_argument("--hour-sd", type=float, default=0.02)
    ap.add_argument("--minute-cv", type=float, default=0.1)
