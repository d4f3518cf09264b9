"""Today's level against the seasonal profile, and how well it predicts the next hour.

The profile says what a Tuesday 15:00 usually brings; a given Tuesday runs a few percent
above or below it, and that offset persists for hours (a busier day, a slower season). A
:class:`Level` per channel (value, count) tracks it from minutes that have **left** the
rolling windows (older than the longest span), so a surge being judged never raises its
own expectation:

- ``a / b``: exponentially weighted observed / expected over those minutes (time constant
  ``LEVEL_TAU_MIN``), shrunk towards 1 by its own noise (``v``: the weighted variance)
  against the profile's level variation ``cv2``, and bounded to ``1 +- 2 sqrt(cv2)`` so a
  sustained surge that has not tripped yet is never absorbed as "today's level";
- ``r_num / r_den``: the squared relative error of each closed hour against the level in
  force when it began (at most a 3-sigma error counts), less its minute noise,
  exponentially weighted over hours (``RESID_TAU_H``): the level variation that remains
  after the correction. Until the weighted count of scored hours reaches ``MIN_HOURS``
  (about two days), the level is 1 and the profile's ``cv2`` stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["LEVEL_TAU_MIN", "MIN_HOURS", "NO_LEVEL", "RESID_TAU_H", "Level", "age_out",
           "close_hour", "current", "format_level", "in_hour", "learned", "parse_level"]

LEVEL_TAU_MIN = 180.0
RESID_TAU_H = 336.0
MIN_HOURS = 48.0
_D = math.exp(-1 / LEVEL_TAU_MIN)
_DH = math.exp(-1 / RESID_TAU_H)


@dataclass(frozen=True, slots=True)
class Level:
    a: float = 0.0  # weighted observed of minutes older than the ring
    b: float = 0.0  # weighted expected
    v: float = 0.0  # weighted (squared weights) variance
    r_num: float = 0.0  # weighted sum over hours of (relative error^2 - noise)
    r_den: float = 0.0
    h_obs: float = 0.0  # the open hour's closed minutes
    h_exp: float = 0.0
    h_var: float = 0.0
    h_level: float = 1.0  # the level in force when the open hour began


NO_LEVEL = Level()


def age_out(lv: Level, observed: float, expected: float, variance: float) -> Level:
    """A minute leaves the rolling windows: it now informs the level. (Built field by
    field here and in :func:`in_hour`: ``dataclasses.replace`` cost a fifth of an endpoint's
    CPU in a backlog.)"""
    if math.isnan(expected):
        return lv
    return Level(lv.a * _D + observed, lv.b * _D + expected, lv.v * _D * _D + variance,
                 lv.r_num, lv.r_den, lv.h_obs, lv.h_exp, lv.h_var, lv.h_level)


def in_hour(lv: Level, observed: float, expected: float, variance: float) -> Level:
    """A minute of the open hour closes (for that hour's error)."""
    if math.isnan(expected):
        return lv
    return Level(lv.a, lv.b, lv.v, lv.r_num, lv.r_den, lv.h_obs + observed,
                 lv.h_exp + expected, lv.h_var + variance, lv.h_level)


def learned(lv: Level) -> bool:
    """Whether the level is in force (enough hours scored; before that it is 1)."""
    return lv.r_den >= MIN_HOURS and lv.b > 0


def current(lv: Level, cv2: float) -> tuple[float, float]:
    """(level, remaining cv2): the multiplier of the expectation and its variation."""
    if not learned(lv):
        return 1.0, cv2
    noise = lv.v / (lv.b * lv.b)
    gain = cv2 / (cv2 + noise) if cv2 + noise > 0 else 0.0
    bound = 2 * math.sqrt(cv2)
    level = 1 + max(-bound, min(bound, (lv.a / lv.b - 1) * gain))
    return level, max(0.0, lv.r_num / lv.r_den)


def close_hour(lv: Level, cv2: float) -> Level:
    """The open hour closes: score it against the level it began with; start the next."""
    r_num, r_den = lv.r_num, lv.r_den
    base = lv.h_level * lv.h_exp
    if base > 0:
        err = (lv.h_obs - base) / base
        # One hour moves the estimate by at most a 3-sigma error: a surge that has not
        # tripped yet must not teach the detector that such hours are normal.
        limit = 9 * max(cv2, r_num / r_den if r_den >= MIN_HOURS else cv2)
        r_num = r_num * _DH + min(err * err, limit) - lv.h_var / (base * base)
        r_den = r_den * _DH + 1
    nxt = replace(lv, r_num=r_num, r_den=r_den, h_obs=0.0, h_exp=0.0, h_var=0.0)
    return replace(nxt, h_level=current(nxt, cv2)[0])


def format_level(lv: Level) -> str:
    return ",".join(repr(x) for x in (lv.a, lv.b, lv.v, lv.r_num, lv.r_den, lv.h_obs,
                                      lv.h_exp, lv.h_var, lv.h_level))


def parse_level(raw: str) -> Level:
    xs = [float(x) for x in raw.split(",")]
    if len(xs) != 9 or not all(math.isfinite(x) for x in xs):
        raise ValueError(f"level: bad value {raw!r}")
    return Level(*xs)
