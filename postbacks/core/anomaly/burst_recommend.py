"""Calibration of the retrodated burst on an operator's own history: what a
``burst_count`` would have done, and the count that would have given zero trips with a
stated margin.

Input is the global count of retrodated deliveries per event-time minute, oldest first
(what the gate's aggregator sums from its partials; minutes left out had none). Each
minute is judged whole, as the gate judges it once the minute's partials are in, by the
same :func:`~.retro_burst.judge` and :func:`~.retro_burst.close_minute` the aggregator
runs.

A span's *needed count* is its retrodated deliveries where every condition of the burst
but the floor holds (over ``multiple`` x usual and over the usual count by ``k``
deviations): a ``burst_count`` at or below it would have tripped there. The
recommendation is the highest needed count outside the labelled incident (and the spans
that reach into it), times ``1 + margin``, above that count by at least one, and never
below :data:`MIN_BURST_COUNT`.

Every minute outside the labelled incident teaches the usual rate (the incident's do not,
as the gate's halted minutes do not), and nothing halts: the report counts every episode
(over after a minute that was not) so an operator sees each day that would have tripped,
not only the first. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from postbacks.core.anomaly.profile import MINUTE_MS
from postbacks.core.anomaly.retro_burst import (
    NO_BURST,
    BurstPolicy,
    close_minute,
    forget_span,
    judge,
)

__all__ = ["MIN_BURST_COUNT", "BurstCalibration", "BurstNeeded", "calibrate_burst",
           "recommend_burst"]

MIN_BURST_COUNT = 20  # below this a quiet history's odd late approval would halt everything


@dataclass(frozen=True, slots=True)
class BurstNeeded:
    count: int  # a burst_count at or below this would have tripped here
    at_ms: int  # end of the minute
    usual: float  # what the span usually held then


@dataclass
class BurstCalibration:
    policy: BurstPolicy
    retrodated: int = 0  # retrodated deliveries in the history
    minutes: int = 0  # minutes with any
    needed: BurstNeeded | None = None  # the highest needed count outside the incident
    trips_outside: int = 0  # episodes outside the incident and its spans' shadow
    first_trip_ms: int | None = None  # end of the minute of the first trip
    incident_trip_ms: int | None = None  # the first trip inside the incident's shadow


def calibrate_burst(series: Iterable[tuple[int, int]], policy: BurstPolicy,
                    incident: tuple[int, int] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> BurstCalibration:
    """Replay ``(minute, retrodated count)`` through the burst under ``policy`` (its floor
    0: the burst is off, nothing trips, the needed counts are still found). ``incident``:
    epoch ms [start, end), excluded from the recommendation."""
    probe = replace(policy, floor=1)  # every condition but the floor
    cal = BurstCalibration(policy)
    s = NO_BURST
    was_over = False
    last: int | None = None
    judged = 0
    forgotten = incident is None

    def forget_incident(minute: int) -> None:
        """Past the incident's end, its minutes leave the span teaching nothing (as a
        person closing the gate's halt there: the span forgotten)."""
        nonlocal s, forgotten
        if not forgotten and incident is not None and minute * MINUTE_MS >= incident[1]:
            s, forgotten = forget_span(s), True

    def step(minute: int, count: int) -> None:
        nonlocal s, was_over, judged
        forget_incident(minute)
        end_ms = (minute + 1) * MINUTE_MS
        shadow = incident is not None and (
            end_ms > incident[0] and (minute - policy.span + 1) * MINUTE_MS < incident[1])
        free = judge(s, minute, count, probe)
        if not shadow and free.observed >= free.threshold and (
                cal.needed is None or free.observed > cal.needed.count):
            cal.needed = BurstNeeded(free.observed, end_ms, free.usual)
        over = judge(s, minute, count, policy).over
        if over and not was_over:
            if cal.first_trip_ms is None:
                cal.first_trip_ms = end_ms
            if shadow:
                if cal.incident_trip_ms is None:
                    cal.incident_trip_ms = end_ms
            else:
                cal.trips_outside += 1
        was_over = over
        inside = incident is not None and incident[0] <= minute * MINUTE_MS < incident[1]
        s = close_minute(s, minute, count, policy, learn=not inside)
        judged += 1
        if progress is not None and judged % 50_000 == 0:
            progress(judged, end_ms)

    for minute, count in series:
        if count < 0 or (last is not None and minute <= last):
            raise ValueError(f"minute {minute}: counts go oldest first, one per minute, "
                             f"none negative (got {count} after minute {last})")
        cal.retrodated += count
        cal.minutes += 1 if count else 0
        if last is not None:
            # the minutes between held none; a span still holding earlier ones may be
            # over in them, and ``span`` minutes on it holds none of them
            for m in range(last + 1, min(minute, last + 1 + policy.span)):
                step(m, 0)
            if minute - last > policy.span:
                was_over = False
                # the quiet minutes closed, as the gate's aggregator closes them
                forget_incident(minute - 1)
                s = close_minute(s, minute - 1, 0, policy)
        step(minute, count)
        last = minute
    return cal


def recommend_burst(cal: BurstCalibration, margin: float) -> BurstPolicy:
    """The policy with the recommended floor: the highest needed count times
    ``1 + margin``, at least one over it, at least :data:`MIN_BURST_COUNT`."""
    if margin < 0:
        raise ValueError(f"margin must be >= 0, not {margin}")
    need = 0 if cal.needed is None else cal.needed.count
    floor = max(MIN_BURST_COUNT, need + 1, math.ceil(need * (1.0 + margin)))
    return replace(cal.policy, floor=floor)
