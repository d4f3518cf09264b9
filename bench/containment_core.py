"""Containment, pure core: the rolling-window detector against seasonal traffic and cohorts.

No Kafka, no gate: the global scope's rolling detector (``postbacks.core.anomaly.rolling``)
runs in process over per-minute totals, in event time. What it generates, per seed:

- ``--weeks`` (6) weeks of normal traffic for ``--apps`` (150) endpoints: Zipf-skewed
  volumes, each endpoint its own lognormal payout (median ~$2, heavy tail); a diurnal
  shape (peak 15:00 UTC, trough 03:00 at 40% of the mean), quieter weekends, a per-day
  level (lognormal, sd ``--day-sd``), a per-hour level (sd ``--hour-sd``), and minute
  counts over-dispersed beyond Poisson (gamma rate, cv ``--minute-cv``). The first
  ``--warmup`` (2) weeks fill the profile; the weeks after are **the normal weeks**, in
  which every trip is a false hold.
- then, on the next Monday, cohorts **on top of normal traffic that keeps flowing**:
  6 h and 40 h long; a global value excess of +25/+50/+100/+400 % of the normal rate at
  each minute; spread over 40+ endpoints (volume-weighted, at least enough of the volume
  that each endpoint's excess stays at most +80% where that is possible) and 240
  campaigns; a third retrodated; starting at the trough (03:00) and at the peak (15:00);
  and a **control**: the same days with no cohort.

Per shape it prints the event-time minutes from the cohort's start to the global trip,
the % of the cohort's payout that arrived before the trip (the tripping minute counted
whole), the % that would have been dispatched (the retrodated third is held by the
retrodating guard anyway), each endpoint's relative excess, and the false trips in the
normal weeks and in the control, and the highest normal-week score per span (value
``5``, count ``c5``); min / median / max over the seeds. Each shape starts from the
detector state at the cohort's start, restored through ``to_dict``/``from_dict``.
``--endpoints`` also runs every endpoint's own detector (bench/containment_endpoints.py).

Usage: ``python bench/containment_core.py [--seeds 3] [--seed 1] [--json FILE]``; about
15 s a seed. Thresholds and spans are flags (``--k``, ``--skew``, ``--count-skew``, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.containment_endpoints import Endpoints, Minute
from bench.containment_traffic import (
    MIN_MS,
    POOL,
    START_MS,
    TAIL_H,
    Traffic,
    _endpoint_pool,
    _per_endpoint,
    _poisson,
    generate,
    traffic_args,
)
from postbacks.core.anomaly.endpoint_state import ENDPOINT_POLICY
from postbacks.core.anomaly.rolling import (
    ENDPOINT_ROLLING,
    GLOBAL_ROLLING,
    NoProfile,
    RollingOver,
    RollingPolicy,
    RollingState,
    RollingThresholds,
    add,
    empty,
    evaluate,
)
from postbacks.core.anomaly.rolling_codec import from_dict, to_dict

EXCESSES = (0.25, 0.5, 1.0, 4.0)
DURATIONS_H = (6, 40)
STARTS = (("trough", 3), ("peak", 15))


def _trip_episodes(state: RollingState, traffic: Traffic, first: int, last: int,
                   count_from: int, th: RollingThresholds,
                   peak: dict[str, float] | None = None) -> tuple[RollingState, int, int]:
    """Feed minutes [first, last); trips (episodes, minutes) from ``count_from`` on.

    ``peak`` collects the highest value score (``5``) and count score (``c5``) per span.
    """
    episodes = tripped = 0
    was = False
    mins, cnts = traffic.minutes, traffic.counts
    for m in range(first, last):
        state = add(state, START_MS + m * MIN_MS, mins[m], cnts[m])
        if m < count_from:
            continue
        r = evaluate(state, th)
        over = isinstance(r, RollingOver)
        if peak is not None:
            for x, arm in zip(state.policy.shifts, state.arms, strict=False):
                peak[f"cusum{x:g}"] = max(arm.s, peak.get(f"cusum{x:g}", -math.inf))
        if peak is not None and not isinstance(r, NoProfile):
            for sc in r.scores:
                for key, z in ((f"{sc.span}", sc.score), (f"c{sc.span}", sc.count_score)):
                    if z > peak.get(key, -math.inf):
                        peak[key] = z
        if over:
            tripped += 1
            episodes += not was
        was = over
    return state, episodes, tripped


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    hours: int
    excess: float
    start_hour: int


def shapes() -> list[Shape]:
    return [Shape(f"{h}h +{round(g * 100)}% {where}", h, g, sh)
            for h in DURATIONS_H for g in EXCESSES for where, sh in STARTS]


def _cohort_members(rng: random.Random, weights: list[float], excess: float) -> list[int]:
    """40+ endpoints, volume-weighted, covering >= excess / 0.8 of the volume if it can."""
    order = sorted(range(len(weights)), key=lambda i: rng.random() ** (1 / weights[i]),
                   reverse=True)
    need = min(1.0, excess / 0.8)
    members: list[int] = []
    share = 0.0
    for i in order:
        if len(members) >= 40 and share >= need - 1e-9:
            break
        members.append(i)
        share += weights[i]
    return members


def run_shape(sh: Shape, snap: dict[str, int | float | str], traffic: Traffic, first: int,
              rng: random.Random, args: argparse.Namespace, th: RollingThresholds,
              eps: Endpoints | None = None) -> dict[str, float | None]:
    members = _cohort_members(rng, traffic.weights, sh.excess)
    share = sum(traffic.weights[i] for i in members)
    pool, pool_ep = _endpoint_pool(rng, traffic.weights, traffic.means, members,
                                   args.payout_sigma)
    extra: list[Minute] = []
    pool_mean = sum(pool) / len(pool)
    retro = [rng.random() < 1 / 3 for _ in range(POOL)]
    state = from_dict(snap)
    total = before = dispatched = 0.0
    trip: int | None = None
    for j in range(sh.hours * 60):
        m = first + j
        lam = sh.excess * traffic.expected[m] / pool_mean
        n = _poisson(rng, lam)
        idx = [rng.randrange(POOL) for _ in range(n)]
        value = sum(pool[i] for i in idx)
        total += value
        if eps is not None and j < 6 * 60:
            extra.append(_per_endpoint(idx, pool, pool_ep))
        if trip is not None:
            continue
        before += value
        dispatched += sum(pool[i] for i in idx if not retro[i])
        state = add(state, START_MS + m * MIN_MS, traffic.minutes[m] + value,
                    traffic.counts[m] + n)
        if isinstance(evaluate(state, th), RollingOver):
            trip = j + 1
    hit, first_hit = eps.cohort(first, extra) if eps is not None else (None, None)
    return {"trip_min": trip, "before_pct": 100 * before / total if total else 0.0,
            "endpoints_tripped": hit, "first_endpoint_trip_min": first_hit,
            "dispatched_pct": 100 * dispatched / total if total else 0.0,
            "endpoint_excess_pct": 100 * sh.excess / share, "endpoints": len(members),
            "campaigns": 240}


def _policy(args: argparse.Namespace) -> RollingPolicy:
    return RollingPolicy(spans=args.spans, clip_sigmas=args.clip, shifts=args.shifts,
                         allowance=args.allowance)


def run_seed(seed: int, args: argparse.Namespace,
             th: RollingThresholds) -> dict[str, object]:
    t0 = time.perf_counter()
    tail = args.weeks * 7 * 1440
    eps = None
    if args.endpoints:
        eps = Endpoints(ENDPOINT_ROLLING,  # as the gate runs an endpoint's detector
                        replace(_policy(args), conversion_cap=ENDPOINT_POLICY.conversion_cap),
                        START_MS, args.warmup * 7 * 1440, tail,
                        tuple(tail + h * 60 for _, h in STARTS))
    traffic = generate(args, seed, eps)
    t_gen = time.perf_counter() - t0
    peak: dict[str, float] = {}
    policy = _policy(args)
    state, episodes, minutes = _trip_episodes(empty(policy), traffic, 0, tail,
                                              traffic.normal_weeks_from, th, peak)
    control_state, c_eps, c_min = _trip_episodes(state, traffic, tail, len(traffic.minutes),
                                                 tail, th)
    del control_state
    snaps = {}
    for _, h in STARTS:
        first = tail + h * 60
        st, _, _ = _trip_episodes(state, traffic, tail, first, first, th)
        snaps[h] = (to_dict(st), first)
    rng = random.Random(seed * 7919 + 1)
    results = {}
    for sh in shapes():
        snap, first = snaps[sh.start_hour]
        results[sh.name] = run_shape(sh, snap, traffic, first, rng, args, th, eps)
    events = sum(traffic.counts)
    return {"seed": seed, "events": events, "normal_false_trips": episodes,
            "normal_tripped_minutes": minutes, "control_false_trips": c_eps,
            "control_tripped_minutes": c_min, "shapes": results,
            "endpoint_normal_false_trips": eps.normal_trips if eps else None,
            "endpoint_control_false_trips": eps.control_trips if eps else None,
            "endpoint_false_trips": eps.false_trips if eps else [],
            "endpoint_needed_k": eps.needed if eps else (0.0, "none"),
            "normal_peak_score": {k: round(v, 2) for k, v in sorted(peak.items())},
            "generate_s": round(t_gen, 1), "total_s": round(time.perf_counter() - t0, 1)}


def _spread(values: Sequence[float | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    miss = len(values) - len(got)
    if not got:
        return "none"
    s = "/".join(fmt.format(x) for x in (min(got), statistics.median(got), max(got)))
    return s + (f" ({miss} none)" if miss else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1, help="first seed")
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds from --seed")
    ap.add_argument("--weeks", type=int, default=6, help="normal weeks incl. warm-up")
    ap.add_argument("--warmup", type=int, default=2, help="weeks that only fill the profile")
    traffic_args(ap)
    ap.add_argument("--spans", type=lambda v: tuple(int(x) for x in v.split(",")),
                    default=RollingPolicy().spans, help="window spans, minutes (5,15,60)")
    ap.add_argument("--clip", type=float, default=RollingPolicy().clip_sigmas)
    ap.add_argument("--k", type=float, default=GLOBAL_ROLLING.k)
    ap.add_argument("--skew", type=float, default=GLOBAL_ROLLING.skew,
                    help="short-span allowance: k + skew / sqrt(span)")
    ap.add_argument("--count-skew", type=float, default=GLOBAL_ROLLING.count_skew)
    ap.add_argument("--multiple", type=float, default=GLOBAL_ROLLING.multiple)
    ap.add_argument("--cusum-h", type=float, default=GLOBAL_ROLLING.cusum_h,
                    help="a CUSUM arm of the count trips above this (inf: off)")
    ap.add_argument("--shifts", type=lambda v: tuple(float(x) for x in v.split(",")),
                    default=RollingPolicy().shifts, help="CUSUM arm shifts (0.25,0.5)")
    ap.add_argument("--allowance", type=float, default=RollingPolicy().allowance)
    ap.add_argument("--floor-usd", type=float, default=GLOBAL_ROLLING.floor_micros / 1e6)
    ap.add_argument("--endpoints", action="store_true",
                    help="also run every endpoint's own detector (slow: minutes a seed)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args(argv)
    th = RollingThresholds(k=args.k, skew=args.skew, count_skew=args.count_skew,
                           multiple=args.multiple,
                           floor_micros=round(args.floor_usd * 1e6),
                           cv_floor=GLOBAL_ROLLING.cv_floor, support_k=GLOBAL_ROLLING.support_k,
                           cusum_h=args.cusum_h)
    t0 = time.perf_counter()
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        r = run_seed(seed, args, th)
        runs.append(r)
        print(f"seed {seed}: {r['events']:,} normal events, false trips: normal weeks "
              f"{r['normal_false_trips']}, control {r['control_false_trips']}; highest "
              f"normal score per span {r['normal_peak_score']} ({r['total_s']} s)", flush=True)
        if args.endpoints:
            print(f"  endpoint scopes: false trips normal weeks "
                  f"{r['endpoint_normal_false_trips']}, control "
                  f"{r['endpoint_control_false_trips']}", flush=True)
            for line in r["endpoint_false_trips"]:  # type: ignore[attr-defined]
                print(f"    {line}", flush=True)
            k, where = r["endpoint_needed_k"]  # type: ignore[misc]
            print(f"  endpoint scopes: highest needed k in the normal weeks {k:.2f} ({where})",
                  flush=True)
    print(f"\nglobal rolling detector: spans={args.spans} clip={args.clip} k={th.k} "
          f"skew={th.skew} count_skew={th.count_skew} "
          f"multiple={th.multiple} cusum_h={th.cusum_h} "
          f"shifts={args.shifts} allowance={args.allowance} "
          f"floor=${th.floor_micros / 1e6:g}; min/median/max over {len(runs)} seeds\n")
    print(f"{'shape':<18} {'trip min':>16} {'% before trip':>20} {'% dispatched':>20} "
          f"{'endpoints':>9} {'excess/endpoint':>16}"
          + (f" {'members tripped (first min)':>28}" if args.endpoints else ""))
    for sh in shapes():
        rows = [r["shapes"][sh.name] for r in runs]  # type: ignore[index]
        line = (f"{sh.name:<18} {_spread([x['trip_min'] for x in rows], '{:.0f}'):>16} "
                f"{_spread([x['before_pct'] for x in rows], '{:.2f}'):>20} "
                f"{_spread([x['dispatched_pct'] for x in rows], '{:.2f}'):>20} "
                f"{_spread([x['endpoints'] for x in rows], '{:.0f}'):>9} "
                f"{_spread([x['endpoint_excess_pct'] for x in rows], '+{:.0f}%'):>16}")
        if args.endpoints:
            hit = _spread([x["endpoints_tripped"] for x in rows], "{:.0f}")
            at = _spread([x["first_endpoint_trip_min"] for x in rows], "{:.0f}")
            line += f" {hit + ' (' + at + ')':>28}"
        print(line)
    normal = [float(r["normal_false_trips"]) for r in runs]  # type: ignore[arg-type]
    control = [float(r["control_false_trips"]) for r in runs]  # type: ignore[arg-type]
    print(f"\nfalse trips (episodes): normal weeks {_spread(normal, '{:.0f}')} over "
          f"{args.weeks - args.warmup} weeks; control {_spread(control, '{:.0f}')} over "
          f"{TAIL_H} h; wall {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"thresholds": str(th), "spans": args.spans,
                                         "clip": args.clip, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
