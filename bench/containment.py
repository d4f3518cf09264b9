"""Containment through real Kafka and the real gate: IR-307-shaped cohorts on top of normal
traffic, the global rolling detector and the retrodating guard under enforce.

Per seed, one fresh namespace (topics, a scratch PostgreSQL database, a global key) and
one ``postbacks gate`` process:

1. **History.** ``--weeks`` (4; the profile needs 2) weeks of normal traffic from
   bench/containment_core.py's generator (``--apps`` endpoints, Zipf volumes, lognormal
   payouts, diurnal and weekly shape, day/hour levels, over-dispersed minutes) go onto
   deliveries.v1 as a backlog, which the gate drains. Every hold in it is a false hold.
2. **The shape week** (the next week, normal traffic throughout). Each chosen shape gets
   its own day at its start hour (03:00 trough, 15:00 peak): no shape uses an hour-of-week
   slot an earlier one touched, and a cohort reaches the profile only a week later. The
   normal minutes up to a shape go as a backlog and are drained; then the shape runs
   **minute by minute**: its normal and cohort deliveries of one event-time minute are
   produced, the bench waits for the gate's output for each of them and ``--settle-s`` for
   the partials and the aggregator, then reads the global row. So the gate is never
   backlogged during a shape. Cohorts are the core's: +25/+50/+100/+400 % of the normal
   value rate, over 40+ endpoints (each endpoint's excess printed) and 240 campaigns, a
   third retrodated; controls are 60 paced minutes with no cohort.
3. **After a trip** ``--after-min`` more cohort minutes are sent (they must be held); the
   rest of the cohort is not sent, because a tripped halt holds everything until a person
   closes it. Normal traffic continues (held) for ``--held-min`` minutes, so the cohort
   has left every span; then the halt is closed as ``postbacks anomaly close`` does.
   A shape that has not tripped after ``--max-min`` minutes stops there; its unsent
   non-retrodated payout is counted as dispatched (nothing would have stopped it).

Per shape: % of the retrodated cohort deliveries held (as retrodated); event-time minutes
from cohort start to the trip (from the trip's reason: window start + span) and to the
first ``halted_global`` hold; % of the cohort's whole payout dispatched (read from
dispatch.v1); holds of normal deliveries in the history, in the controls and elsewhere in
the shape week outside halts. min/median/max over seeds. Progress on stderr.

Bounded: ``--budget-min`` (60) minutes of wall time; past it no further shape starts
(skipped ones are listed). At the defaults (150 endpoints, 120 conversions a minute, as
bench/containment_core.py) one seed takes about 15 minutes, most of it the history's
4.9 million deliveries; ``--rate 40 --apps 120`` takes about 9. The full
matrix (16 shapes + 2 controls) does not fit one week: run ``--shapes 6h,control`` and
``--shapes 40h,control``. Run under ``flock /tmp/postbacks-bench.lock``. Results JSON:
``bench/results/containment-latest.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import containment_core as core
from bench.containment_feed import (
    Feed,
    arm,
    close_global,
    global_state,
    progress,
    wait_watermark,
    watermark_reader,
)
from bench.containment_plan import MIN_MS, Placed, place, select, tally, trip_minute
from bench.harness import ROOT, cleanup, env_for, fresh, scratch_database, stop_on_signals
from postbacks.core.anomaly.rolling import DEFAULT_SPANS
from postbacks.settings import Settings, load_settings
from postbacks.tools.procs import Stack, wait_for

WEEK_MS = 7 * 86_400_000


class Run:
    def __init__(self, s: Settings, seed: int, args: argparse.Namespace) -> None:
        self.s, self.args, self.seed = s, args, seed
        self.idx: list[list[int]] = []
        self.pool: list[int] = []
        self.pool_ep: list[int] = []
        gen = argparse.Namespace(**{**vars(args), "weeks": args.weeks + 1,
                                    "warmup": args.weeks})
        self.traffic = core.generate(gen, seed, sink=self._keep)
        now = int(time.time() * 1000)
        weeks_back = (now - core.START_MS) // WEEK_MS - (args.weeks + 2)
        self.t0 = core.START_MS + weeks_back * WEEK_MS  # a Monday, all of it in the past
        self.eps = [f"ep_{s.instance_id}_{i}" for i in range(args.apps)]
        self.feed = Feed(s)
        self.cursor = 0  # next normal minute to send
        self.watermark: Callable[[], int | None] = lambda: None  # the gate's, once it runs
        self.rng = random.Random(seed * 7919 + 1)

    def _keep(self, m: int, idx: list[int], pool: list[int], pool_ep: list[int]) -> None:
        self.idx.append(idx)
        self.pool, self.pool_ep = pool, pool_ep

    def at(self, m: int, i: int, n: int) -> int:
        return self.t0 + m * MIN_MS + (i * MIN_MS) // max(1, n)

    def normal_until(self, end: int) -> None:
        for m in range(self.cursor, end):
            row = self.idx[m]
            for i, k in enumerate(row):
                self.feed.send(f"dlv_n{m}_{i}", self.eps[self.pool_ep[k]],
                               self.at(m, i, len(row)), self.pool[k])
        self.cursor = max(self.cursor, end)

    def shape(self, k: int, pl: Placed) -> dict[str, Any]:
        a, sh, first = self.args, pl.shape, pl.first
        self.normal_until(first)
        self.feed.wait()
        time.sleep(a.settle_s)
        rng = random.Random(self.seed * 7919 + 1 + k)
        members = core._cohort_members(rng, self.traffic.weights, sh.excess or 0.01)
        share = sum(self.traffic.weights[i] for i in members)
        pool, pool_ep = core._endpoint_pool(rng, self.traffic.weights, self.traffic.means,
                                            members, a.payout_sigma)
        pool_mean = sum(pool) / len(pool)
        retro = [rng.random() < 1 / 3 for _ in range(core.POOL)]
        sent: dict[str, tuple[int, bool]] = {}
        start_ms = self.t0 + first * MIN_MS
        trip_seen: int | None = None
        n_cohort = 0
        fed = 0
        total = unsent_open = 0
        campaigns: set[int] = set()
        t_start = time.monotonic()
        for j in range(sh.hours * 60):
            m = first + j
            n = core._poisson(rng, sh.excess * self.traffic.expected[m] / pool_mean)
            picks = [rng.randrange(core.POOL) for _ in range(n)]
            total += sum(pool[i] for i in picks)
            stop = j >= a.max_min or (trip_seen is not None and j > trip_seen + a.after_min)
            if stop:
                if trip_seen is None:
                    unsent_open += sum(pool[i] for i in picks if not retro[i])
                continue
            fed = j + 1
            self.normal_until(m + 1)
            for i, p in enumerate(picks):
                did = f"dlv_c{k}_{n_cohort}"
                n_cohort += 1
                campaigns.add(p % 240)
                self.feed.send(did, self.eps[pool_ep[p]], self.at(m, i, n) + 7, pool[p],
                               retro=retro[p], snapshot={"campaign": f"cmp_{p % 240}",
                                                         "cohort": sh.name})
                sent[did] = (pool[p], retro[p])
            self.feed.wait(timeout=120)
            time.sleep(a.settle_s)
            if trip_seen is None and global_state(self.s)[0] == "tripped":
                trip_seen = j
                progress(f"  {sh.name}: tripped, seen after minute {j + 1}")
        paced_s = time.monotonic() - t_start
        state, reason = global_state(self.s)
        tripped = state == "tripped"
        trip = trip_minute(reason, start_ms) if tripped else None
        first_hold = self.feed.first_global_hold
        hold_min = (first_hold - start_ms) // MIN_MS + 1 if first_hold else None
        held_before = len(self.feed.normal_held)
        if tripped:
            self.normal_until(first + fed + a.held_min)
            self.feed.wait()
            # The cohort out of every span in the roll-up, not only out of the gate: a
            # close while the roll-up's spans still hold the cohort trips on it again.
            gone = self.t0 + (first + fed + max(DEFAULT_SPANS) + 1) * MIN_MS
            caught_up = wait_watermark(self.watermark, gone)
            close_global(self.s)
            time.sleep(a.settle_s + 2)
            self.feed.first_global_hold = None
        else:
            caught_up = None
        halted_normal = len(self.feed.normal_held) - held_before
        self.closed_at = self.cursor
        t = tally(sent, self.feed.cohort, total, unsent_open)
        row = {"trip_min": trip, "first_global_hold_min": hold_min,
               "retro_held_pct": t.retro_held_pct, "retro_sent": t.retro_sent,
               "dispatched_pct": t.dispatched_pct, "unsent_pct": t.unsent_pct,
               "cohort_sent": len(sent), "cohort_minutes_fed": fed,
               "endpoints": len(members) if sh.excess else 0, "campaigns": len(campaigns),
               "endpoint_excess_pct": 100 * sh.excess / share if sh.excess else 0.0,
               "normal_held_while_halted": halted_normal, "reason": reason,
               "tripped_by": None if reason is None or not tripped else (
                   "burst" if reason.startswith("retrodated burst") else "value rate"),
               "roll_up_past_cohort_at_close": caught_up,
               "paced_s": round(paced_s, 1)}
        progress(f"  {sh.name}: trip {trip} min, retro held {t.retro_held_pct}, "
                 f"dispatched {t.dispatched_pct:.2f}% ({fed} min paced in {paced_s:.0f} s)")
        return row


def run_seed(seed: int, args: argparse.Namespace, base: Settings, plan: list[Placed],
             deadline: float) -> dict[str, Any]:
    t0 = time.monotonic()
    with scratch_database(base.database_url, f"containment{seed}") as url:
        s = fresh(dataclasses.replace(base, database_url=url), f"cont{seed}")
        s = dataclasses.replace(s, anomaly_global_key=s.instance_id + "-g")
        arm(s, burst=not args.no_burst)
        progress(f"seed {seed}: generating {args.weeks + 1} weeks for {args.apps} endpoints")
        run = Run(s, seed, args)
        hist_end = args.weeks * 7 * 1440
        log_dir = ROOT / ".local" / "bench-logs" / f"containment-{int(time.time())}-{seed}"
        env = env_for(s, POSTBACKS_ANOMALY_GLOBAL_KEY=s.anomaly_global_key)
        out: dict[str, Any] = {"seed": seed, "shapes": {}, "skipped": []}
        try:
            with Stack(env, log_dir) as stack:
                stack.start("gate", "gate")
                run.watermark = watermark_reader(stack.procs["gate"].log_path)
                wait_for(lambda: "gate running" in stack.procs["gate"].tail(400), 90,
                         what="the gate")
                run.normal_until(hist_end)
                progress(f"seed {seed}: history of {run.feed.sent:,} deliveries produced; "
                         "the gate drains it")
                drain = run.feed.wait()
                time.sleep(args.settle_s + 2)
                out["history_deliveries"] = run.feed.sent
                out["history_drain_s"] = round(drain, 1)
                out["normal_week_holds"] = len(run.feed.normal_held)
                state = global_state(s)
                out["state_after_history"] = state[0]
                progress(f"seed {seed}: history drained in {drain:.0f} s, "
                         f"{len(run.feed.normal_held)} held, global {state[0]}")
                if state[0] == "tripped":
                    close_global(s)
                halted: set[int] = set()
                for k, pl in enumerate(plan):
                    if time.monotonic() > deadline:
                        out["skipped"].append(pl.shape.name)
                        continue
                    row = run.shape(k, pl)
                    out["shapes"][pl.shape.name] = row
                    halted.update(range(pl.first, run.closed_at if row["trip_min"] is not None
                                        else pl.first))
                    if stack.dead():
                        raise RuntimeError(f"gate died: {stack.procs['gate'].tail(2000)}")
                week = [(m, r) for m, r in run.feed.normal_held if m >= hist_end]
                out["shape_week_holds_outside_halts"] = sum(1 for m, _ in week
                                                            if m not in halted)
                ctl = [pl for pl in plan if pl.shape.excess == 0 and
                       pl.shape.name in out["shapes"]]
                out["control_holds"] = sum(1 for m, _ in week for pl in ctl
                                           if pl.first <= m < pl.first + 60)
                out["normal_deliveries"] = sum(len(x) for x in run.idx[:run.cursor])
        finally:
            run.feed.close()
            cleanup()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def _col(rows: list[dict[str, Any]], key: str, fmt: str) -> str:
    return core._spread([r.get(key) for r in rows], fmt)


def report(runs: list[dict[str, Any]], plan: list[Placed]) -> None:
    print(f"\n{'shape':<17} {'trip min':>12} {'1st held min':>12} {'retro held %':>15} "
          f"{'% dispatched':>17} {'endpoints':>9} {'campaigns':>9} {'excess/endpoint':>15} "
          f"tripped by")
    for pl in plan:
        rows = [r["shapes"][pl.shape.name] for r in runs if pl.shape.name in r["shapes"]]
        if not rows:
            continue
        print(f"{pl.shape.name:<17} {_col(rows, 'trip_min', '{:.0f}'):>12} "
              f"{_col(rows, 'first_global_hold_min', '{:.0f}'):>12} "
              f"{_col(rows, 'retro_held_pct', '{:.1f}'):>15} "
              f"{_col(rows, 'dispatched_pct', '{:.2f}'):>17} "
              f"{_col(rows, 'endpoints', '{:.0f}'):>9} {_col(rows, 'campaigns', '{:.0f}'):>9} "
              f"{_col(rows, 'endpoint_excess_pct', '+{:.0f}%'):>15} "
              + "/".join(str(r.get("tripped_by") or "-") for r in rows))
    for key, what in (("normal_week_holds", "holds in the history (normal weeks)"),
                      ("control_holds", "holds in the controls"),
                      ("shape_week_holds_outside_halts",
                       "holds in the shape week outside halts")):
        vals = [float(r[key]) for r in runs if key in r]
        print(f"{what}: {core._spread(vals, '{:.0f}')}")
    drains = [r["history_deliveries"] / r["history_drain_s"] for r in runs
              if r.get("history_drain_s")]
    print(f"history: {_col(runs, 'history_deliveries', '{:,.0f}')} deliveries, drained at "
          f"{core._spread(drains, '{:,.0f}')} /s; wall {_col(runs, 'wall_s', '{:.0f}')} s "
          f"a seed; skipped: {sorted({x for r in runs for x in r['skipped']}) or 'none'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Bounded by --budget-min (default 60 min of wall "
                                 "time); run under flock /tmp/postbacks-bench.lock.")
    ap.add_argument("--seed", type=int, default=1, help="first seed")
    ap.add_argument("--seeds", type=int, default=3, help="how many seeds from --seed")
    ap.add_argument("--weeks", type=int, default=4, help="weeks of history before the shapes")
    core.traffic_args(ap, apps=150, rate=120.0)
    ap.add_argument("--shapes", default="6h,control",
                    help="comma-separated name prefixes (6h, 40h, 6h+50%%, control, all)")
    ap.add_argument("--max-min", type=int, default=75, help="paced cohort minutes at most")
    ap.add_argument("--after-min", type=int, default=3, help="cohort minutes sent after a trip")
    ap.add_argument("--held-min", type=int, default=90,
                    help="normal minutes after the cohort before the halt is closed")
    ap.add_argument("--settle-s", type=float, default=0.4,
                    help="wait per paced minute for the partials and the aggregator")
    ap.add_argument("--budget-min", type=float, default=60.0,
                    help="no shape starts after this many minutes of wall time")
    ap.add_argument("--no-burst", action="store_true",
                    help="arm the retrodating guard per endpoint instead of globally, so "
                    "the retrodated burst is off and the value rate alone halts")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" /
                    "containment-latest.json")
    args = ap.parse_args(argv)
    stop_on_signals()
    chosen = select(args.shapes)
    busy = args.max_min + args.after_min + args.held_min + 30
    plan = place(chosen, args.weeks * 7 * 1440, busy)
    deadline = time.monotonic() + args.budget_min * 60
    base = load_settings()  # each seed migrates its own scratch database
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        if time.monotonic() > deadline:
            progress(f"budget spent: seed {seed} and later not run")
            break
        runs.append(run_seed(seed, args, base, plan, deadline))
        progress(f"seed {seed} done in {runs[-1]['wall_s']} s")
    report(runs, plan)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                     "plan": [(p.shape.name, p.first) for p in plan],
                                     "runs": runs}, indent=1))
    progress(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
