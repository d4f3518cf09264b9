"""Rolling-window payout detector: value rate over sliding spans against a seasonal expectation.

Per scope (an endpoint, or the global roll-up) the state keeps the closed minutes of the
last ``max(spans)`` minutes (observed, expected and variance, for payout value and for the
count of conversions) plus the open minute, the open hour's accumulators, and an
hour-of-week :mod:`profile <postbacks.core.anomaly.profile>` of the trailing weeks. Every
span (default 5, 15 and 60 minutes) ends at the open minute and slides with it, one
minute at a time.

**Expectation for the same span.** Each minute's expectation is the profile's
interpolated per-minute rate, fixed when the minute closes (so an hour that closes into the
profile never explains itself away). A span sums the expectations of the minutes it
covers; the open minute counts for the fraction of it already elapsed at ``now``. A span
reaching back before the scope's first minute covers only the minutes seen: a partial
window is judged against what was expected for the part already seen.

**Today's level.** The expectation is multiplied by today's level against the profile
(:mod:`.level`), learned from minutes that have left the windows, so a surge being judged
never raises its own expectation.

**Noise-aware trip.** For a span with observed ``O``, expected ``E`` and variance
``V = (sum(minute variances) + cv2 * E^2) * (1 + 1/n)`` (minute noise, the level variation
that remains, and the error of a mean of ``n`` weekly samples; see :mod:`.profile`), the
score is ``z = (O' - E) / sqrt(V)`` where ``O'`` caps every minute at its expectation plus
the larger of ``clip_sigmas`` minute deviations and the expectation
(:meth:`RollingPolicy.cap`): one large payout moves the score by a bounded amount, a surge
of up to +100% a minute is not capped. The same score is computed for the *count* of
conversions (``zc``, uncapped: a count has no large payouts, so it is far steadier than
value and sees a broad surge of ordinary conversions sooner). A span trips when **all**
hold:

- ``z > k_for(seen)``, or ``zc > count_k_for(seen)`` with ``z > support_k`` (the scope's
  own noise: a steady global total trips on a small excess, a noisy small endpoint needs
  a large one; a count surge trips only when the money moved with it). ``seen`` is the
  minutes the span covers: its length, fewer for a partial window, whose sum of fewer
  minutes is more skewed;
- ``O > multiple * E`` (the configured multiple: a floor on the relative excess);
- ``O - E > floor_micros`` (an absolute minimum, for small endpoints only).

**A span's noise is at least one conversion's.** Where a span expects less than one
conversion (a sparse endpoint's short spans, the first minute after a close), the count's
variance is taken as at least 1 and the value's as at least one conversion at the slot's
mean payout squared: one conversion more than a fraction expected is no evidence, and a
Gaussian score on a fraction of a conversion would call it one. A burst still trips.

**CUSUM arms** (:mod:`.cusum`, one per ``policy.shifts``: +50% by default) run on the count,
against its expectation times ``1 + allowance x`` the remaining level deviation, from the
moment today's level is learned. An arm trips when its statistic is over ``cusum_h`` and
its run (the minutes since it last left zero) is over the multiple and the floor, with a
value score over ``support_k``. The spans are judged first; an arm's trip reports its run
as the window. :func:`reset_arms` starts them again at a close.

No expectation (a slot with fewer than ``min_weeks`` samples in the span) never trips.
Late events (an earlier minute than the open one) count in the open minute: late money
still counts now. Minutes without events are zeros. Pure: event time drives everything.
The state goes to a table changelog through :mod:`.rolling_codec` (``to_dict``,
``from_dict``). The gate runs it for the global scope (``docs/detector.md``).
"""

from __future__ import annotations

import math
from dataclasses import replace

from postbacks.core.anomaly.detectors import NO_BASELINE, WITHIN, Over, RateResult
from postbacks.core.anomaly.level import NO_LEVEL, age_out, current, in_hour
from postbacks.core.anomaly.level import close_hour as close_level_hour
from postbacks.core.anomaly.profile import (
    COUNT,
    MINUTE_MS,
    SLOTS,
    Profile,
    close_hour,
    count_stats,
    expect_minute,
    slot_of_hour,
    stats,
    with_slot,
)
from postbacks.core.anomaly.rolling_arms import (
    arm_scores,
    arm_trips,
    arms_at,
    figures,
    open_fraction,
    step_arms,
    z,
)
from postbacks.core.anomaly.rolling_types import (
    DEFAULT_SPANS,
    ENDPOINT_ROLLING,
    GLOBAL_ROLLING,
    NO_PROFILE,
    NoProfile,
    RollingOver,
    RollingPolicy,
    RollingResult,
    RollingState,
    RollingThresholds,
    RollingWithin,
    SpanScore,
)

__all__ = [
    "DEFAULT_SPANS",
    "ENDPOINT_ROLLING",
    "GLOBAL_ROLLING",
    "NO_PROFILE",
    "NoProfile",
    "RollingOver",
    "RollingPolicy",
    "RollingResult",
    "RollingState",
    "RollingThresholds",
    "RollingWithin",
    "SpanScore",
    "add",
    "advance",
    "arm_scores",
    "arm_trips",
    "as_rate_result",
    "describe",
    "empty",
    "evaluate",
    "push_minute",
    "reset_arms",
]

_NAN = float("nan")



def empty(policy: RollingPolicy | None = None) -> RollingState:
    p = policy or RollingPolicy()
    profile: Profile = ((),) * SLOTS
    return RollingState(p, None, 0, 0, (), (), (), (), (), (), (), 0, 0, 0.0, 0, profile,
                        stats(profile, p.min_weeks), count_stats(profile, p.min_weeks))


class _Ring:
    """A state's closed minutes, levels and arms as lists to append to: :func:`advance`
    closes minute after minute into one, then builds one state (a state per closed minute
    cost most of an endpoint's CPU in a backlog)."""

    __slots__ = ("arms", "capped", "cexp", "cobs", "cvar", "exp", "lc", "lv", "obs", "var")

    def __init__(self, s: RollingState) -> None:
        self.obs, self.capped = list(s.obs), list(s.capped)
        self.exp, self.var = list(s.exp), list(s.var)
        self.cobs, self.cexp, self.cvar = list(s.cobs), list(s.cexp), list(s.cvar)
        self.lv, self.lc, self.arms = s.lv, s.lc, s.arms

    def push(self, s: RollingState, minute: int, observed: int, count: int) -> None:
        """Close ``minute`` (its expectations fixed now from ``s``'s profile statistics);
        keeps the ring's size."""
        p = s.policy
        got = expect_minute(s.st, minute)
        e, v = got if got is not None else (_NAN, 0.0)
        cgot = expect_minute(s.cst, minute)
        ce, cv = cgot if cgot is not None else (_NAN, 0.0)
        cap = float(observed) if got is None else min(float(observed),
                                                      p.cap(e, v, count, ce))
        n = p.ring
        lv, lc = in_hour(self.lv, cap, e, v), in_hour(self.lc, float(count), ce, cv)
        if len(self.obs) >= n:  # the oldest minute leaves the windows: it informs the level
            lv = age_out(lv, self.capped[0], self.exp[0], self.var[0])
            lc = age_out(lc, float(self.cobs[0]), self.cexp[0], self.cvar[0])
            for ring in (self.obs, self.capped, self.exp, self.var, self.cobs, self.cexp,
                         self.cvar):
                del ring[0]
        if minute >= s.arms_from:
            fig = figures(p, s.st.cv2, s.cst.cv2, self.lv, self.lc,
                          (float(observed), e, v), (float(count), ce, cv))
            self.arms = step_arms(p.shifts, self.arms, fig, minute)
        self.lv, self.lc = lv, lc
        self.obs.append(observed)
        self.capped.append(cap)
        self.exp.append(e)
        self.var.append(v)
        self.cobs.append(count)
        self.cexp.append(ce)
        self.cvar.append(cv)

    def into(self, s: RollingState) -> RollingState:
        return replace(s, lv=self.lv, lc=self.lc, arms=self.arms, obs=tuple(self.obs),
                       capped=tuple(self.capped), exp=tuple(self.exp), var=tuple(self.var),
                       cobs=tuple(self.cobs), cexp=tuple(self.cexp), cvar=tuple(self.cvar))


def push_minute(s: RollingState, minute: int, observed: int, count: int) -> RollingState:
    """Close ``minute`` into the ring (its expectations fixed now); keeps the ring's size."""
    ring = _Ring(s)
    ring.push(s, minute, observed, count)
    return ring.into(s)


def reset_arms(s: RollingState, from_minute: int) -> RollingState:
    """Every arm back to zero, stepping only minutes from ``from_minute`` (a close)."""
    return replace(s, arms=(), arms_from=from_minute)


def _close_hours(s: RollingState, first: int, upto: int, learn: bool = True) -> RollingState:
    """Close hours ``first`` .. ``upto - 1`` (the first with the accumulators, then zeros).
    ``learn`` False (the scope is halted): the hours leave the hour-of-week profile as it
    was -- each slot keeps its earlier weeks; today's level (bounded, hours long) follows
    them as usual."""
    p = s.policy
    n = upto - first
    if n <= 0:
        return s
    entry = (s.h_total, s.h_count, s.h_sq, s.h_csq)
    blank = replace(s, h_total=0, h_count=0, h_sq=0.0, h_csq=0)
    if not learn:
        lv, lc = s.lv, s.lc
        for _ in range(min(n, p.weeks * SLOTS)):
            lv, lc = close_level_hour(lv, s.st.cv2), close_level_hour(lc, s.cst.cv2)
        return replace(blank, lv=lv, lc=lc)
    if n > p.weeks * SLOTS:  # longer than the history: every sample is a zero
        profile: Profile = (((0, 0, 0.0, 0),) * p.weeks,) * SLOTS
        return replace(blank, profile=profile, st=stats(profile, p.min_weeks),
                       cst=count_stats(profile, p.min_weeks), lv=NO_LEVEL, lc=NO_LEVEL)
    profile, st, cst, lv, lc = s.profile, s.st, s.cst, s.lv, s.lc
    for h in range(first, upto):
        slot = slot_of_hour(h)
        profile = close_hour(profile, slot, entry, p.weeks)
        st = with_slot(st, profile, slot, p.min_weeks)
        cst = with_slot(cst, profile, slot, p.min_weeks, COUNT)
        lv, lc = close_level_hour(lv, st.cv2), close_level_hour(lc, cst.cv2)
        entry = (0, 0, 0.0, 0)
    return replace(blank, profile=profile, st=st, cst=cst, lv=lv, lc=lc)


def advance(s: RollingState, minute: int, learn: bool = True) -> RollingState:
    """Close the open minute and every minute before ``minute`` (zeros); open ``minute``.
    ``learn`` False: the hours closed on the way are not learnt (:func:`_close_hours`)."""
    old = s.minute
    if old is None or minute <= old:
        return s
    cur, ccur = s.cur, s.ccur
    ring = _Ring(s)
    ring.push(s, old, cur, ccur)
    s = replace(s, h_sq=s.h_sq + float(cur) * cur, h_csq=s.h_csq + ccur * ccur, cur=0, ccur=0)
    hour = old // 60
    keep_from = minute - s.policy.ring
    m = old + 1
    if m < keep_from:  # a gap longer than the ring: its early minutes are only hours
        m = keep_from
        if m // 60 > hour:
            s = _close_hours(ring.into(s), hour, m // 60, learn)
            ring, hour = _Ring(s), m // 60
    while m < minute:
        if m // 60 > hour:  # the profile and the levels move: through a state
            s = _close_hours(ring.into(s), hour, m // 60, learn)
            ring, hour = _Ring(s), m // 60
        ring.push(s, m, 0, 0)
        m += 1
    s = ring.into(s)
    if minute // 60 > hour:
        s = _close_hours(s, hour, minute // 60, learn)
    return replace(s, minute=minute)


def add(s: RollingState, occurred_at_ms: int, micros: int, count: int = 1,
        learn: bool = True) -> RollingState:
    """Count a payout (or a pre-aggregated ``count`` of them) at its event time; ``learn``
    False (the scope is halted): the hours it closes are not learnt (:func:`advance`)."""
    minute = occurred_at_ms // MINUTE_MS
    if s.minute is None:
        return replace(s, minute=minute, cur=micros, ccur=count, h_total=micros,
                       h_count=count)
    if minute > s.minute:
        s = advance(s, minute, learn)
    # Every delivery of a scope comes here: built field by field (``replace`` costs 4x).
    return RollingState(s.policy, s.minute, s.cur + micros, s.ccur + count, s.obs, s.capped,
                        s.exp, s.var, s.cobs, s.cexp, s.cvar, s.h_total + micros,
                        s.h_count + count, s.h_sq, s.h_csq, s.profile, s.st, s.cst, s.lv,
                        s.lc, s.arms, s.arms_from)


def _score(s: RollingState, span: int, frac: float, opens: tuple[float, float, float, float],
           levels: tuple[float, float, float, float], inflate: float,
           usable: int) -> SpanScore | None:
    """``levels``: (value level, value cv2, count level, count cv2); ``usable``: closed
    minutes the span may cover at most."""
    n = min(span - 1, len(s.obs), usable)
    e_open, v_open, ce_open, cv_open = opens
    lv, cv2, lc, ccv2 = levels
    e = math.fsum(s.exp[-n:]) + e_open * frac if n else e_open * frac
    if math.isnan(e):
        return None
    v = (math.fsum(s.var[-n:]) if n else 0.0) + v_open * frac
    o = (sum(s.obs[-n:]) if n else 0) + s.cur
    oc = (math.fsum(s.capped[-n:]) if n else 0.0) + min(
        float(s.cur), s.policy.cap(e_open * frac, v_open, s.ccur, ce_open * frac))
    e *= lv
    v = (v * lv + cv2 * e * e) * inflate
    co = (sum(s.cobs[-n:]) if n else 0) + s.ccur
    ce = ((math.fsum(s.cexp[-n:]) if n else 0.0) + ce_open * frac) * lc
    cvv = ((math.fsum(s.cvar[-n:]) if n else 0.0) + cv_open * frac) * lc
    cvv = (cvv + ccv2 * ce * ce) * inflate
    if 0 <= ce < 1:  # less than one conversion expected: at least one conversion's noise
        cvv = max(cvv, 1.0)
        if ce > 0:
            v = max(v, (e / ce) ** 2)
    cz = 0.0 if math.isnan(ce) else z(co, ce, cvv)
    return SpanScore(span, n + 1, o, e, math.sqrt(v), z(oc, e, v), co, ce, cz)


def evaluate(s: RollingState, th: RollingThresholds, now_ms: int | None = None,
             since_minute: int | None = None) -> RollingResult:
    """Score every span ending at the open minute, as of ``now_ms`` (event time).

    ``now_ms`` inside the open minute counts that minute's expectation pro rata (at its
    start, nothing is expected of it yet); None or later counts the whole minute.
    ``since_minute``: no span reaches back before this minute (a span covering less is a
    partial window); an open minute before it is not judged at all (no profile).
    """
    minute = s.minute
    if minute is None or (since_minute is not None and minute < since_minute):
        return NO_PROFILE
    usable = len(s.obs) if since_minute is None else minute - since_minute
    frac = open_fraction(minute, now_ms)
    got = expect_minute(s.st, minute)
    cgot = expect_minute(s.cst, minute)
    opens = ((got if got is not None else (_NAN, 0.0))
             + (cgot if cgot is not None else (_NAN, 0.0)))
    floor2 = th.cv_floor * th.cv_floor
    lvl, cv2 = current(s.lv, max(s.st.cv2, floor2))
    clvl, ccv2 = current(s.lc, max(s.cst.cv2, floor2))
    levels = (lvl, max(cv2, floor2), clvl, max(ccv2, floor2))
    # The expectation is itself a mean of n weekly samples: its error adds 1/n of the noise.
    inflate = 1 + 1 / max(1, len(s.profile[slot_of_hour(minute // 60)]))
    scores = []
    over: SpanScore | None = None
    for span in s.policy.spans:
        sc = _score(s, span, frac, opens, levels, inflate, usable)
        if sc is None:
            continue
        scores.append(sc)
        if (over is None
                and (sc.score > th.k_for(sc.seen)
                     or (sc.count_score > th.count_k_for(sc.seen)
                         and sc.score > th.support_k))
                and sc.observed_micros > th.multiple * sc.expected_micros
                and sc.observed_micros - sc.expected_micros > th.floor_micros):
            over = sc
    if not scores:
        return NO_PROFILE
    if over is None and minute >= s.arms_from and got is not None and cgot is not None:
        over = next((a for a in arms_at(s, minute, frac, opens) if arm_trips(a, th)
                     and (since_minute is None or minute - a.seen + 1 >= since_minute)),
                    None)
    if over is not None:
        start = (minute - over.seen + 1) * MINUTE_MS
        return RollingOver(start, over, tuple(scores))
    return RollingWithin(tuple(scores))


def as_rate_result(r: RollingResult) -> RateResult:
    """The result type :func:`.modes.decide` takes (:data:`.detectors.RateResult`)."""
    match r:
        case RollingOver(window_start_ms=start, over=sc):
            return Over(start, sc.observed_micros, sc.expected_micros)
        case RollingWithin():
            return WITHIN
    return NO_BASELINE


def describe(r: RollingOver) -> str:
    """Which span tripped, on what score: the trip's reason."""
    sc = r.over
    if sc.arm:  # a CUSUM arm: its run is the window, its statistic the score
        return (f"{sc.span}-min span (CUSUM {sc.arm} arm, log-likelihood ratio "
                f"{sc.score:.1f}): payout {sc.observed_micros / 1e6:.2f} USD vs "
                f"{sc.expected_micros / 1e6:.2f} expected, count {sc.observed_count} vs "
                f"{sc.expected_count:.1f}")
    return (f"{sc.span}-min span ({sc.seen} min seen): payout {sc.observed_micros / 1e6:.2f}"
            f" USD vs {sc.expected_micros / 1e6:.2f} expected, score {sc.score:.1f}, count "
            f"{sc.observed_count} vs {sc.expected_count:.1f}, score {sc.count_score:.1f}")
