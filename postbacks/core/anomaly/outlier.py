"""One payout far above anything the endpoint was paid lately: the single-payout check.

The value rate (:mod:`.rolling`) weighs a minute's money against what the minute usually
brings, with one payout's weight bounded, so one large payout on a sparse endpoint moves
its score only so much. This check judges each payout alone, against the endpoint's
**peak**: the largest payout sent to it in the :data:`WEEKS` completed event-time weeks
before the payout's week (calendar weeks of the epoch, from Thursday 00:00 UTC). A payout
is an outlier when it is over ``multiple`` x the peak **and** over the peak by more than
``floor_micros`` (the value-rate row's floor: $200 by default). It is judged once the
endpoint's history starts at least :data:`MIN_WEEKS` weeks back with :data:`MIN_PAYOUTS`
payouts counted, and only while it was paid in the weeks before; a history without a
payout for :data:`WEEKS` weeks starts again.

The current week's payouts raise the peak only once their week is over: a payout just
under the bound, then one just under the raised bound, and so on, walked the peak up five
times a payout (seven payouts from $240 to $999,999 in an afternoon). And a payout dated
before the endpoint's newest week is judged, and counted, as of that week: dated years
back, one was judged against no history at all, and dated last week, it raised a peak
already in use.

Only payouts the gate sends raise the peak (the caller's rule): an outlier never does, so
a stream of mispriced payouts keeps being judged, and nor does a payout held for another
reason. A payout of 0 counts nothing. The verdicts are kept with the peaks: a delivery
read again after a crash (its later deliveries already counted) is an outlier exactly
when it was one the first time. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from postbacks.core.anomaly.windows import DAY_MS

__all__ = [
    "MIN_PAYOUTS", "MIN_WEEKS", "NO_PEAKS", "WEEKS", "Peaks", "describe_outlier", "judge",
    "note", "peaks_from", "to_json", "verdict", "with_verdict",
]

WEEK_MS = 7 * DAY_MS
WEEKS = 4  # the peak is the largest payout of this many event-time weeks
MIN_WEEKS = 2  # judged once the endpoint's first payout is this many weeks back
MIN_PAYOUTS = 10  # ... and at least this many payouts were counted
VERDICTS = 32  # the latest outlier verdicts kept (a delivery read again gets its own back)


@dataclass(frozen=True, slots=True)
class Peaks:
    since: int | None = None  # the week of the first payout counted
    weeks: tuple[tuple[int, int], ...] = ()  # (week, largest payout), oldest first
    n: int = 0  # payouts counted since ``since`` (saturating)
    # (source offset, peak) of the latest deliveries judged outliers: read again after a
    # crash, a delivery is an outlier exactly when it was one the first time
    verdicts: tuple[tuple[int, int], ...] = ()


NO_PEAKS = Peaks()


def note(p: Peaks, at_ms: int, micros: int) -> Peaks:
    """``p`` with a payout sent at event time ``at_ms`` counted: in its week, or in the
    endpoint's newest week if it is dated before that (module doc). A payout of 0 counts
    nothing. With no payout in the :data:`WEEKS` weeks before it, the history starts
    again at its week (an endpoint back after a silence is judged as a new one)."""
    if micros <= 0:
        return p
    week = at_ms // WEEK_MS
    n = p.n + 1 if p.n < MIN_PAYOUTS else p.n  # (only "enough" matters)
    weeks = p.weeks
    if not weeks or p.since is None:
        return Peaks(week, ((week, micros),), 1, p.verdicts)
    last_week, last_max = weeks[-1]
    if week <= last_week:
        if micros <= last_max and n == p.n:
            return p  # the usual case: nothing moves (no allocation per delivery)
        return Peaks(p.since, (*weeks[:-1], (last_week, max(last_max, micros))), n,
                     p.verdicts)
    if week > last_week + WEEKS:  # (re)start after a silence
        return Peaks(week, ((week, micros),), 1, p.verdicts)
    return Peaks(p.since, tuple((w, m) for w, m in (*weeks, (week, micros))
                                if w >= week - WEEKS), n, p.verdicts)


def judge(p: Peaks, at_ms: int, micros: int, multiple: float, floor_micros: int) -> int | None:
    """The peak ``micros`` is an outlier against, or None (not an outlier, a history too
    short, no payout in the completed weeks before, or ``multiple`` 0: the check is off).
    Judged in the payout's week, or the endpoint's newest week if that is later."""
    if micros <= floor_micros or multiple <= 0 or p.since is None or p.n < MIN_PAYOUTS:
        return None  # (most payouts: under the floor, never an outlier)
    week = max(at_ms // WEEK_MS, p.weeks[-1][0]) if p.weeks else at_ms // WEEK_MS
    if p.since > week - MIN_WEEKS:
        return None
    recent = [m for w, m in p.weeks if week - WEEKS <= w < week]  # completed weeks only
    if not recent:
        return None
    peak = max(recent)
    return peak if micros > multiple * peak and micros - peak > floor_micros else None


def verdict(p: Peaks, offset: int) -> int | None:
    """The peak a delivery read again was judged an outlier against, or None."""
    for o, peak in p.verdicts:
        if o == offset:
            return peak
    return None


def with_verdict(p: Peaks, offset: int, peak: int) -> Peaks:
    return Peaks(p.since, p.weeks, p.n, (*p.verdicts[-(VERDICTS - 1):], (offset, peak)))


def describe_outlier(micros: int, peak: int, multiple: float) -> str:
    """A hold's detail: ``USD 5,000.00 over 5 x the endpoint's 4-week peak of USD 40.00``."""
    return (f"USD {micros / 1e6:,.2f} over {multiple:g} x the endpoint's {WEEKS}-week peak "
            f"of USD {peak / 1e6:,.2f}")


def to_json(p: Peaks) -> list[object] | None:
    if p.since is None and not p.verdicts:
        return None
    return [p.since, [[w, m] for w, m in p.weeks], p.n, [[o, m] for o, m in p.verdicts]]


def _pairs(v: object) -> bool:
    return isinstance(v, list) and all(
        isinstance(x, list) and len(x) == 2 and type(x[0]) is int and type(x[1]) is int
        and x[1] >= 0 for x in v)


def peaks_from(value: object) -> Peaks:
    """The peaks :func:`to_json` wrote; ValueError when malformed."""
    if value is None:
        return NO_PEAKS
    if (isinstance(value, list) and len(value) == 4
            and (value[0] is None or type(value[0]) is int) and _pairs(value[1])
            and type(value[2]) is int and value[2] >= 0 and _pairs(value[3])):
        return Peaks(value[0], tuple((w, m) for w, m in value[1]), value[2],
                     tuple((o, m) for o, m in value[3]))
    raise ValueError("endpoint state: malformed payout peaks")
