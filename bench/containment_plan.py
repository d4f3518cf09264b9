"""Containment through Kafka, the pure part: which shapes run, where in the shape week each
starts, the trip minute read from the trip's reason, and the per-shape tally.

Placement rule: each shape starts at its own hour of the week (a trough shape at 03:00 and
a peak shape at 15:00 of its own day), so no shape starts in an hour-of-week slot an earlier
shape in the same week touched; a cohort enters the profile only a week later, and the
shape week is the last week generated. Shapes are 12 hours apart, so each one's cohort, the
held minutes after its trip and the close are over (and the 60-minute span is clean again)
before the next begins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.containment_core import Shape, shapes

DAY_MIN = 1440
MIN_MS = 60_000
SLOT_GAP_MIN = 12 * 60  # a trough start to the next peak start
CONTROLS = (Shape("control trough", 1, 0.0, 3), Shape("control peak", 1, 0.0, 15))


def compact(name: str) -> str:
    return name.replace(" ", "")


def select(spec: str) -> list[Shape]:
    """Shapes named by ``spec``: comma-separated prefixes of the compact names
    (``6h``, ``40h+50%``, ``6h+25%trough``), ``control``, or ``all``; in the core's order,
    controls last, each once."""
    every = [*shapes(), *CONTROLS]
    tokens = [t.strip().replace(" ", "") for t in spec.split(",") if t.strip()]
    if not tokens:
        raise ValueError("no shapes selected")
    picked: list[Shape] = []
    for t in tokens:
        hit = every if t == "all" else [s for s in every if compact(s.name).startswith(t)]
        if not hit:
            raise ValueError(f"no shape matches {t!r} (names: "
                             f"{', '.join(compact(s.name) for s in every)})")
        picked += [s for s in hit if s not in picked]
    return [s for s in every if s in picked]


@dataclass(frozen=True, slots=True)
class Placed:
    shape: Shape
    first: int  # minute index (from the generator's minute 0) of the cohort's first minute


def place(chosen: list[Shape], week_from: int, busy_min: int, days: int = 7) -> list[Placed]:
    """Each shape on its own day at its start hour, in time order. ``busy_min`` is how long
    a shape occupies the gate (cohort, held minutes after the trip, the close); it must end
    before the next start 12 hours later."""
    if busy_min >= SLOT_GAP_MIN:
        raise ValueError(f"a shape occupies {busy_min} min: more than the "
                         f"{SLOT_GAP_MIN} min between a trough and a peak start")
    by_hour: dict[int, int] = {}
    out = []
    for sh in chosen:
        day = by_hour.get(sh.start_hour, 0)
        if day >= days:
            raise ValueError(f"more than {days} shapes start at {sh.start_hour:02d}:00: "
                             "run them in several runs (--shapes)")
        by_hour[sh.start_hour] = day + 1
        out.append(Placed(sh, week_from + day * DAY_MIN + sh.start_hour * 60))
    return sorted(out, key=lambda p: p.first)


_REASON = re.compile(r"in window (\d+) \((\d+)-min span")


def trip_minute(reason: str | None, cohort_start_ms: int) -> int | None:
    """Event-time minutes from the cohort's start to the trip, 1-based (the tripping
    minute counted whole): the tripped span's window start plus its length."""
    m = _REASON.search(reason or "")
    if m is None:
        return None
    end = int(m.group(1)) + int(m.group(2)) * MIN_MS
    return (end - cohort_start_ms) // MIN_MS


@dataclass(frozen=True, slots=True)
class CohortTally:
    retro_sent: int
    retro_held_pct: float | None  # held as retrodated, of the retrodated deliveries sent
    dispatched_pct: float  # of the whole cohort's payout (sent or not)
    unsent_pct: float  # of the cohort's payout never sent (after the trip, or past the cap)


def tally(sent: dict[str, tuple[int, bool]], outcome: dict[str, str], total_micros: int,
          unsent_open_micros: int) -> CohortTally:
    """``sent``: delivery id -> (payout, retrodated); ``outcome``: delivery id ->
    ``dispatched`` or its hold reason; ``total_micros``: the whole cohort's payout;
    ``unsent_open_micros``: payout of unsent non-retrodated deliveries that would have
    been dispatched (0 when the scope had tripped: a halt holds everything until a person
    closes it)."""
    retro = [d for d, (_, r) in sent.items() if r]
    held = sum(1 for d in retro if outcome.get(d) == "retrodated")
    disp = sum(p for d, (p, _) in sent.items() if outcome.get(d) == "dispatched")
    unsent = total_micros - sum(p for p, _ in sent.values())
    return CohortTally(len(retro), 100 * held / len(retro) if retro else None,
                       100 * (disp + unsent_open_micros) / total_micros if total_micros else 0.0,
                       100 * unsent / total_micros if total_micros else 0.0)
