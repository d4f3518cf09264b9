"""The rolling detector's CUSUM arms (:mod:`.cusum`) as it runs them: the figures of a minute
for them, their step at each closed minute, and their scores and trip rule with the open
minute counted. :mod:`.rolling` keeps their state in its ring and judges them after the
spans; the two share the excess in standard deviations (:func:`z`) and the open minute's
elapsed fraction (:func:`open_fraction`)."""

from __future__ import annotations

import math

from postbacks.core.anomaly.cusum import NO_ARM, Arm, MinuteFigures, step
from postbacks.core.anomaly.level import Level, current, learned
from postbacks.core.anomaly.profile import MINUTE_MS, expect_minute
from postbacks.core.anomaly.rolling_types import (
    RollingPolicy,
    RollingState,
    RollingThresholds,
    SpanScore,
)

__all__ = ["ARM_CV2", "arm_scores", "arm_trips", "arms_at", "figures", "open_fraction",
           "step_arms", "z"]

NAN = float("nan")

ARM_CV2 = 0.02 ** 2  # the level deviation arms allow for is at least 2%


def figures(p: RollingPolicy, cv2: float, ccv2_profile: float, lv: Level, lc: Level,
            value: tuple[float, float, float],
            count: tuple[float, float, float]) -> MinuteFigures:
    """A minute for the arms: they test the count, and sum the value for the run. ``value``:
    (observed, expected, variance) before today's level; ``count`` likewise; ``cv2`` and
    ``ccv2_profile``: the profile's level variation of value and count."""
    o, e, v = value
    c, ce, cv = count
    lvl = current(lv, max(cv2, ARM_CV2))[0]
    clvl, ccv2 = current(lc, max(ccv2_profile, ARM_CV2))
    # Before today's level is learned the expectation carries the whole day's level error,
    # which a CUSUM would accumulate: the arms wait for it (about two days of hours).
    ce, cv = (ce * clvl, cv * clvl) if learned(lc) else (NAN, 0.0)
    allow = 1 + p.allowance * math.sqrt(max(ccv2, ARM_CV2))
    return MinuteFigures(c, ce * allow, cv, o, e * lvl, v * lvl, c, ce)


def step_arms(shifts: tuple[float, ...], arms: tuple[Arm, ...], fig: MinuteFigures,
              minute: int) -> tuple[Arm, ...]:
    """Every arm stepped over the closed ``minute`` (arms at zero when there are none)."""
    arms = arms or (NO_ARM,) * len(shifts)
    return tuple(step(arm, x, fig, minute) for arm, x in zip(arms, shifts, strict=True))


def z(o: float, e: float, v: float) -> float:
    """The excess ``o - e`` in standard deviations (variance ``v``)."""
    sigma = math.sqrt(v)
    return (o - e) / sigma if sigma > 0 else (math.inf if o > e else 0.0)


def open_fraction(minute: int, now_ms: int | None) -> float:
    """How much of the open minute has elapsed at ``now_ms`` (None: all of it)."""
    if now_ms is None:
        return 1.0
    return min(1.0, max(0.0, (now_ms - minute * MINUTE_MS) / MINUTE_MS))


def arms_at(s: RollingState, minute: int, frac: float,
             opens: tuple[float, float, float, float]) -> tuple[SpanScore, ...]:
    """Every arm with the open minute counted (``frac`` of it), as a :class:`SpanScore`."""
    e, v, ce, cv = (x * frac for x in opens)
    fig = figures(s.policy, s.st.cv2, s.cst.cv2, s.lv, s.lc, (float(s.cur), e, v),
                  (float(s.ccur), ce, cv))
    out = []
    for x, a in zip(s.policy.shifts, step_arms(s.policy.shifts, s.arms, fig, minute),
                    strict=True):
        n = minute - a.start + 1 if a.s > 0 else 0
        out.append(SpanScore(n, n, int(a.obs), a.exp, math.sqrt(a.var), a.s, int(a.cobs),
                             a.cexp, a.s, f"count +{x * 100:g}%"))
    return tuple(out)


def arm_scores(s: RollingState, now_ms: int | None = None) -> tuple[SpanScore, ...]:
    """Every CUSUM arm as of ``now_ms`` (as :func:`evaluate` counts the open minute):
    ``span``/``seen`` its run in minutes (0: at zero), ``score`` its statistic, ``arm`` its
    name. () when the open minute has no expectation or the arms do not step yet."""
    minute = s.minute
    if minute is None or minute < s.arms_from:
        return ()
    got, cgot = expect_minute(s.st, minute), expect_minute(s.cst, minute)
    if got is None or cgot is None:
        return ()
    return arms_at(s, minute, open_fraction(minute, now_ms), got + cgot)


def arm_trips(sc: SpanScore, th: RollingThresholds) -> bool:
    """An arm's statistic over ``cusum_h``, its run's payout over the multiple and the
    floor, and the run's value score over ``support_k`` (the money moved with the count)."""
    return (sc.score > th.cusum_h
            and sc.observed_micros > th.multiple * sc.expected_micros
            and sc.observed_micros - sc.expected_micros > th.floor_micros
            and z(sc.observed_micros, sc.expected_micros, sc.sigma_micros ** 2)
            > th.support_k)
