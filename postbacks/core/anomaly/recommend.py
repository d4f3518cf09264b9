"""Calibration of the global rolling detector on an operator's own history: what it would
have done, and the threshold that would have given zero trips with a stated margin.

Input is the global payout and count per event-time minute, oldest first (what the gate's
aggregator sums from its partials). Each minute is added whole to one
:class:`~.rolling.RollingState` and every span is scored as at the end of that minute --
what the gate sees once the minute's partials are in. Per minute and span the score a
threshold must stay above for that span not to trip is its *needed k*: the value score
less ``skew / sqrt(seen)``, and, where the value score is above ``support_k``, the count
score less ``count_skew / sqrt(seen)``; only where the span is also over ``multiple`` x
expected and over the floor (otherwise no k trips it). The recommendation is the highest
needed k over the history outside the labelled incident, plus ``margin``, and never below
``min_k``.

The enforce simulation is the gate's: a trip halts the scope for the rest of the history
(nobody closes it), so every payout after it is *would-have-held*. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from postbacks.core.anomaly.profile import MINUTE_MS
from postbacks.core.anomaly.rolling import (
    RollingOver,
    RollingPolicy,
    RollingState,
    RollingThresholds,
    RollingWithin,
    SpanScore,
    add,
    arm_scores,
    arm_trips,
    empty,
    evaluate,
    reset_arms,
)

__all__ = ["Calibration", "DayRow", "Needed", "calibrate", "needed_h", "needed_k",
           "recommend"]

MIN_K = 3.0  # the recommendation never goes below this many sigmas
MIN_H = 8.0  # nor a CUSUM arm's h below this (e^8 minutes: about 2 years between false trips)


@dataclass(frozen=True, slots=True)
class Needed:
    k: float  # a threshold at or below this would have tripped here
    at_ms: int  # end of the minute
    span: int
    channel: str  # "value" or "count"


@dataclass
class DayRow:
    day: str  # YYYY-MM-DD (UTC, event time)
    minutes: int = 0
    payout_micros: int = 0
    count: int = 0
    trips: int = 0  # spans going over (an episode: over after a minute that was not)
    held_count: int = 0  # after the first trip (the scope halted, nobody closed it)
    held_micros: int = 0
    closest: float | None = None  # the highest needed k that day
    closest_h: float | None = None  # the highest CUSUM statistic over the multiple and floor


@dataclass
class Calibration:
    thresholds: RollingThresholds
    days: dict[str, DayRow] = field(default_factory=dict)
    needed: Needed | None = None  # the highest needed k outside the incident
    needed_h: Needed | None = None  # the highest arm statistic outside it (``k``: that h)
    first_trip_ms: int | None = None  # end of the minute of the first trip
    incident_trip_ms: int | None = None  # the first trip inside the incident
    minutes: int = 0
    incident_minutes: int = 0
    trips_outside: int = 0  # trips starting outside the incident and its spans' shadow


def _day(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).date().isoformat()


def needed_k(sc: SpanScore, th: RollingThresholds) -> tuple[float, str] | None:
    """The k at or below which this span trips (None: the multiple or floor stops it)."""
    if not (sc.observed_micros > th.multiple * sc.expected_micros
            and sc.observed_micros - sc.expected_micros > th.floor_micros):
        return None
    span_term = sc.seen ** 0.5  # as evaluate: the minutes the span covers
    best = (sc.score - th.skew / span_term, "value")
    if sc.score > th.support_k:
        by_count = sc.count_score - th.count_skew / span_term
        if by_count > best[0]:
            best = (by_count, "count")
    return best


def needed_h(sc: SpanScore, th: RollingThresholds) -> float | None:
    """The ``h`` at or below which this arm trips (None: the run is at zero, under the
    multiple or the floor, or a count arm without the value's support)."""
    if sc.seen == 0:
        return None
    open_h = replace(th, cusum_h=1e-12)
    return sc.score if arm_trips(sc, open_h) else None


def calibrate(minutes: Iterable[tuple[int, int, int]], th: RollingThresholds,
              policy: RollingPolicy | None = None, incident: tuple[int, int] | None = None,
              progress: Callable[[int, int], None] | None = None,
              progress_every: int = 10_080) -> Calibration:
    """``minutes``: (minute since the epoch, payout micros, count), ascending; minutes
    without payouts may be left out. ``incident``: [start, end) epoch ms of a labelled
    incident (excluded from the recommendation, with the minutes after it whose spans still
    reach back into it; its trip time reported)."""
    out = Calibration(th)
    s: RollingState = empty(policy)
    tail_ms = (max(s.policy.spans) - 1) * MINUTE_MS
    halted = closed = False
    was_over = False
    for n, (minute, micros, count) in enumerate(minutes, 1):
        s = add(s, minute * MINUTE_MS, micros, count)  # the minute open, whole
        end_ms = (minute + 1) * MINUTE_MS
        at = minute * MINUTE_MS
        inside = incident is not None and incident[0] <= at < incident[1]
        # spans still reaching back into the incident are the incident's too
        shadow = incident is not None and incident[0] <= at < incident[1] + tail_ms
        row = out.days.get(_day(minute))
        if row is None:
            row = out.days[_day(minute)] = DayRow(_day(minute))
        row.minutes += 1
        row.payout_micros += micros
        row.count += count
        out.minutes += 1
        out.incident_minutes += inside
        if incident is not None and at >= incident[1] and not closed:
            s, closed = reset_arms(s, minute), True  # the incident's halt closed at its end
        r = evaluate(s, th)
        if not shadow and isinstance(r, RollingOver | RollingWithin):
            for sc in r.scores:
                got = needed_k(sc, th)
                if got is not None:
                    _note(out, row, Needed(got[0], end_ms, sc.span, got[1]))
        if not inside:
            for sc in arm_scores(s):
                h = needed_h(sc, th)
                if h is not None:
                    _note_h(out, row, Needed(h, end_ms, sc.span, sc.arm))
        over = isinstance(r, RollingOver)
        if over and not was_over:
            row.trips += 1
            if out.first_trip_ms is None:
                out.first_trip_ms = end_ms
            if inside and out.incident_trip_ms is None:
                out.incident_trip_ms = end_ms
            out.trips_outside += not shadow
        was_over = over
        if halted:
            row.held_count += count
            row.held_micros += micros
        halted = halted or over
        if progress is not None and n % progress_every == 0:
            progress(n, minute * MINUTE_MS)
    return out


def _note(out: Calibration, row: DayRow, need: Needed) -> None:
    if row.closest is None or need.k > row.closest:
        row.closest = need.k
    if out.needed is None or need.k > out.needed.k:
        out.needed = need


def _note_h(out: Calibration, row: DayRow, need: Needed) -> None:
    if row.closest_h is None or need.k > row.closest_h:
        row.closest_h = need.k
    if out.needed_h is None or need.k > out.needed_h.k:
        out.needed_h = need


def recommend(cal: Calibration, margin: float = 0.5, min_k: float = MIN_K,
              h_margin: float = 2.0, min_h: float = MIN_H) -> RollingThresholds:
    """The thresholds with ``k`` = the highest needed k + ``margin`` (at least ``min_k``)
    and the arms' ``h`` = the highest arm statistic + ``h_margin`` (at least ``min_h``):
    over the same history outside the incident, nothing trips."""
    if margin < 0 or h_margin < 0:
        raise ValueError(f"margins must be >= 0, not {margin}, {h_margin}")
    need = cal.needed.k if cal.needed is not None else 0.0
    h = round(max(min_h, (cal.needed_h.k if cal.needed_h is not None else 0.0) + h_margin), 2)
    return replace(cal.thresholds, k=round(max(min_k, need + margin), 2), cusum_h=h)
