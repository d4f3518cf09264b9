"""One payout far above anything the endpoint was paid lately: the single-payout check.

The value rate (:mod:`.rolling`) weighs a minute's money against what the minute usually
brings, with one payout's weight bounded, so one large payout on a sparse endpoint moves
its score only so much. This check judges each payout alone, against the endpoint's
**peak**: the largest payout counted on it in each of the last :data:`WEEKS` event-time
weeks (the newest one included). A payout is an outlier when it is over ``multiple`` x
the peak **and** over the peak by more than ``floor_micros`` (the value-rate row's floor:
$200 by default), once the endpoint's first payout is at least :data:`MIN_WEEKS` weeks
old. With no payout in the retained weeks there is no peak: nothing is judged.

A payout judged an outlier does not raise the peak, so a stream of mispriced payouts
keeps being judged; every other payout does (in detect and off modes too, so a peak is
ready when the endpoint is armed). Pure; the peaks are a max and a min, so counting a
payout twice (a delivery read again after a crash) changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from postbacks.core.anomaly.windows import DAY_MS

__all__ = [
    "MIN_WEEKS", "NO_PEAKS", "WEEKS", "Peaks", "describe_outlier", "judge", "note",
    "peaks_from", "to_json",
]

WEEK_MS = 7 * DAY_MS
WEEKS = 4  # the peak is the largest payout of this many event-time weeks
MIN_WEEKS = 2  # judged once the endpoint's first payout is this many weeks old


@dataclass(frozen=True, slots=True)
class Peaks:
    since: int | None = None  # the week of the first payout counted
    weeks: tuple[tuple[int, int], ...] = ()  # (week, largest payout), oldest first


NO_PEAKS = Peaks()


def note(p: Peaks, at_ms: int, micros: int) -> Peaks:
    """``p`` with a payout at event time ``at_ms`` counted (weeks before the retained ones:
    only ``since`` moves)."""
    week = at_ms // WEEK_MS
    since = week if p.since is None or week < p.since else p.since
    weeks = p.weeks
    newest = weeks[-1][0] if weeks else week
    if week <= newest - WEEKS:  # late: older than any week kept
        return p if since == p.since else Peaks(since, weeks)
    kept = {w: m for w, m in weeks}
    if kept.get(week, -1) >= micros and since == p.since:
        return p
    kept[week] = max(kept.get(week, 0), micros)
    top = max(kept)
    return Peaks(since, tuple(sorted((w, m) for w, m in kept.items() if w > top - WEEKS)))


def judge(p: Peaks, at_ms: int, micros: int, multiple: float, floor_micros: int) -> int | None:
    """The peak ``micros`` is an outlier against, or None (not an outlier, no peak yet, or
    ``multiple`` 0: the check is off)."""
    if multiple <= 0 or p.since is None or not p.weeks:
        return None
    week = at_ms // WEEK_MS
    if p.since > week - MIN_WEEKS:
        return None
    recent = [m for w, m in p.weeks if w > week - WEEKS]
    if not recent:
        return None
    peak = max(recent)
    return peak if micros > multiple * peak and micros - peak > floor_micros else None


def describe_outlier(micros: int, peak: int, multiple: float) -> str:
    """A hold's detail: ``USD 5,000.00 over 5 x the endpoint's 4-week peak of USD 40.00``."""
    return (f"USD {micros / 1e6:,.2f} over {multiple:g} x the endpoint's {WEEKS}-week peak "
            f"of USD {peak / 1e6:,.2f}")


def to_json(p: Peaks) -> list[object] | None:
    return None if p.since is None else [p.since, [[w, m] for w, m in p.weeks]]


def peaks_from(value: object) -> Peaks:
    """The peaks :func:`to_json` wrote; ValueError when malformed."""
    if value is None:
        return NO_PEAKS
    if (isinstance(value, list) and len(value) == 2 and type(value[0]) is int
            and isinstance(value[1], list)
            and all(isinstance(x, list) and len(x) == 2 and type(x[0]) is int
                    and type(x[1]) is int and x[1] >= 0 for x in value[1])):
        return Peaks(value[0], tuple((w, m) for w, m in value[1]))
    raise ValueError("endpoint state: malformed payout peaks")
