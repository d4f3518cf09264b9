"""Incident rehearsal through Kafka: a recorded or generated conversion history fed into
``conversions.v1`` through the real producer helper, paced by event time.

Everything downstream is the product itself — fan-out, the gate (its modes, windows,
trips and halts), the held queue, the agents, the sink — so a whole incident (weeks of
normal traffic, then a cohort) runs as it would in production, only faster::

    python -m streams.anomaly_gate.history --out h.jsonl --weeks 4 --inject broad_shallow
    python -m streams.anomaly_gate.rehearse --file h.jsonl --speedup 3600 \\
        --seed-endpoints http://127.0.0.1:8090 --tag run1

Pacing: an event whose ``occurred_at`` is ``t`` after the first one is produced ``t /
speedup`` after the start (``--speedup 0``: as fast as the producer goes). Event times are
kept as recorded, so the gate judges them in event time. ``--tag`` appends to every
conversion and event id, so a history can be rehearsed again without colliding with the
deliveries of an earlier run. Progress goes to stderr every ``--progress-s`` seconds; the
summary (sent, acknowledged, wall time, achieved speed-up) at the end. A line that is not a
usable conversion is counted and named, never produced.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from postbacks.errors import InvalidRecord
from postbacks.records import ConversionEvent
from postbacks.settings import Settings

__all__ = ["Pacer", "RehearsalReport", "add_arguments", "main", "rehearse"]

_MIN_SLEEP_S = 0.005


@dataclass(slots=True)
class Pacer:
    """When to produce an event: ``(occurred_at - first) / speedup`` after the start."""

    speedup: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    first_ms: int | None = None
    start_s: float = 0.0

    def wait_for(self, occurred_at_ms: int) -> float:
        """Sleep until the event is due; returns how far behind schedule we are (s)."""
        if self.first_ms is None:
            self.first_ms, self.start_s = occurred_at_ms, self.clock()
            return 0.0
        if self.speedup <= 0:
            return 0.0
        due = self.start_s + max(0, occurred_at_ms - self.first_ms) / 1000 / self.speedup
        ahead = due - self.clock()
        if ahead > _MIN_SLEEP_S:
            self.sleep(ahead)
            return 0.0
        return -ahead if ahead < 0 else 0.0


@dataclass(slots=True)
class RehearsalReport:
    sent: int = 0
    acked: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    first_ms: int | None = None
    last_ms: int | None = None
    wall_s: float = 0.0
    max_behind_s: float = 0.0

    @property
    def achieved_speedup(self) -> float | None:
        if self.first_ms is None or self.last_ms is None or self.wall_s <= 0:
            return None
        return (self.last_ms - self.first_ms) / 1000 / self.wall_s


def _tagged(ev: ConversionEvent, tag: str | None) -> ConversionEvent:
    if not tag:
        return ev
    out = dict(ev)
    out["conversion_id"] = f"{ev['conversion_id']}_{tag}"
    out["event_id"] = f"{ev['event_id']}_{tag}"
    return out  # type: ignore[return-value]


def _iso(ms: int | None) -> str:
    from postbacks.cli_output import iso

    return iso(ms) if ms is not None else "-"


def rehearse(settings: Settings, events: Iterable[ConversionEvent], *, speedup: float,
             tag: str | None = None, limit: int | None = None, progress_s: float = 5.0,
             out: Any = None, pacer: Pacer | None = None) -> RehearsalReport:
    """Produce ``events`` (event-time ordered) to ``conversions.v1``, paced; see the module
    doc. Returns after every produced event is acknowledged (or failed)."""
    from postbacks.emit import ConversionProducer

    producer = ConversionProducer(settings)
    out = out if out is not None else sys.stderr  # at call time: stderr may be replaced
    pacer = pacer or Pacer(speedup)
    report = RehearsalReport()
    start = last_print = time.monotonic()
    for ev in events:
        if limit is not None and report.sent >= limit:
            break
        at = ev.get("occurred_at")
        if type(at) is not int:
            key = "occurred_at is not epoch ms"
            report.refused[key] = report.refused.get(key, 0) + 1
            continue
        report.max_behind_s = max(report.max_behind_s, pacer.wait_for(at))
        try:
            producer.send(_tagged(ev, tag))
        except InvalidRecord as exc:
            key = str(exc).split(": ", 1)[-1][:120]
            report.refused[key] = report.refused.get(key, 0) + 1
            continue
        report.sent += 1
        report.first_ms = at if report.first_ms is None else report.first_ms
        report.last_ms = at
        now = time.monotonic()
        if progress_s > 0 and now - last_print >= progress_s:
            last_print = now
            rate = report.sent / max(now - start, 1e-9)
            print(f"rehearse: {report.sent:,} sent ({rate:,.0f}/s), event time "
                  f"{_iso(at)}, behind schedule {report.max_behind_s:.1f} s at most",
                  file=out, flush=True)
    failed = producer.flush()
    report.acked = producer.acked
    report.wall_s = time.monotonic() - start
    if failed:
        report.refused["not acknowledged by the broker"] = failed
    return report


def _events(args: argparse.Namespace) -> Iterator[ConversionEvent]:
    from postbacks.core.instants import InstantError, parse_instant
    from streams.anomaly_gate.history import (
        HistoryConfig,
        cohort_named,
        generate,
        read_jsonl,
    )

    if args.file:
        source: Iterator[ConversionEvent] = read_jsonl(args.file)
    else:
        start = args.weeks * 168 + args.cohort_hour
        cfg = HistoryConfig(weeks=args.weeks, apps=args.apps, mean_rate_per_s=args.rate,
                            namespace=args.namespace,
                            cohorts=tuple(cohort_named(n, start) for n in args.inject))
        source = generate(cfg, random.Random(args.seed))
    try:
        lo = parse_instant(args.since, "--from") if args.since else None
        hi = parse_instant(args.until, "--to") if args.until else None
    except InstantError as exc:
        raise SystemExit(f"rehearse: error: {exc}") from None
    for ev in source:
        at = ev.get("occurred_at")
        if type(at) is int and ((lo is not None and at < lo) or (hi is not None and at >= hi)):
            continue
        yield ev


def add_arguments(ap: argparse.ArgumentParser) -> None:
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="a JSONL history (one ConversionEvent per line, "
                     "event-time ordered), e.g. from streams.anomaly_gate.history")
    src.add_argument("--generate", action="store_true",
                     help="generate a seasonal history (see --weeks, --apps, --inject)")
    ap.add_argument("--speedup", type=float, default=3600.0,
                    help="event time per wall time (default 3600: an hour a second; 0: "
                    "as fast as possible)")
    ap.add_argument("--from", dest="since", help="only events at or after this time "
                    "(epoch ms or ISO-8601 with an offset)")
    ap.add_argument("--to", dest="until", help="only events before this time")
    ap.add_argument("--limit", type=int, help="stop after this many events")
    ap.add_argument("--tag", help="appended to every conversion and event id (a fresh run)")
    ap.add_argument("--seed-endpoints", metavar="RECEIVER_URL",
                    help="first create one endpoint per app of the history, pointing at this "
                    "receiver (apps app_<namespace>_NNNN)")
    ap.add_argument("--weeks", type=int, default=4, help="--generate: weeks of normal traffic")
    ap.add_argument("--apps", type=int, default=120, help="--generate and --seed-endpoints")
    ap.add_argument("--rate", type=float, default=0.62, help="--generate: mean events/s")
    ap.add_argument("--seed", type=int, default=1, help="--generate: RNG seed")
    ap.add_argument("--namespace", default="cal", help="the history's app namespace")
    ap.add_argument("--inject", action="append", default=[],
                    choices=["retrodated", "concentrated", "broad_shallow"],
                    help="--generate: add this cohort after the weeks (repeatable)")
    ap.add_argument("--cohort-hour", type=int, default=9,
                    help="--generate: the cohort's hour on the Monday after the weeks")
    ap.add_argument("--progress-s", type=float, default=5.0, help="progress line interval")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.seed_endpoints:
        from postbacks.tools.seed import seed_endpoints

        made = seed_endpoints(settings, apps=args.apps, endpoints_per_app=1,
                              receiver_url=args.seed_endpoints, namespace=args.namespace,
                              now_ms=int(time.time() * 1000))
        print(f"rehearse: {len(made)} endpoints seeded for apps app_{args.namespace}_NNNN",
              file=sys.stderr)
    r = rehearse(settings, _events(args), speedup=args.speedup, tag=args.tag,
                 limit=args.limit, progress_s=args.progress_s)
    speed = r.achieved_speedup
    print(f"rehearse: {r.sent:,} events produced, {r.acked:,} acknowledged, event time "
          f"{_iso(r.first_ms)} .. {_iso(r.last_ms)} in {r.wall_s:.1f} s"
          + (f" ({speed:,.0f}x)" if speed else ""), file=sys.stderr)
    for why, n in sorted(r.refused.items()):
        print(f"rehearse: {n:,} not produced: {why}", file=sys.stderr)
    return 0 if r.acked == r.sent and not r.refused else 1


def main(argv: Sequence[str] | None = None) -> int:
    from postbacks.settings import load_settings

    ap = argparse.ArgumentParser(
        prog="python -m streams.anomaly_gate.rehearse",
        description="Feed a recorded or generated conversion history into conversions.v1 "
        "through the real producer, paced by event time, so an incident runs through "
        "fan-out, the gate, the held queue, trips and release.")
    add_arguments(ap)
    return run(load_settings(), ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
