"""CUSUM arms: a sustained relative excess of conversions, accumulated minute by minute.

A rolling span of ``n`` minutes carries the day's level error whole: over 60 minutes a
level 3% off is as large as the minute noise of a busy scope, so a long span needs a
large excess before its score clears the threshold. A CUSUM (Page's cumulative sum) of
the log-likelihood ratio for "the rate is ``1 + shift`` times the expectation" against
"the rate is the expectation" does not: each minute adds

    inc = (o * ln(1 + shift) - shift * e) / phi,   phi = v / e  (the minute's dispersion)

the quasi-Poisson log-likelihood ratio (exact for a Poisson count, ``phi = 1``). Under the
expectation the increments drift down by about ``shift^2 e / (2 phi)`` a minute; a level
error ``eps`` raises them by ``eps ln(1 + shift) e / phi``, which stays smaller while
``eps`` is below about half the shift. The statistic ``S = max(0, S + inc)`` then stays
near zero, and a sustained excess of ``shift`` or more climbs at about
``shift^2 e / (2 phi)`` a minute. For a true likelihood ratio the mean time between false
crossings of ``h`` is at least ``e^h`` minutes, whatever the rate.

The rolling detector (:mod:`.rolling`) runs arms on the **count** of conversions, which
has no payout sizes: on payout value one large payout moves a likelihood ratio by a lot,
and the arms false-tripped there in the bench. A count arm's run also sums the payout, so
a trip needs the money to have moved with the count. An :class:`Arm` keeps ``S`` and its
run (the minute ``S`` last left zero, the run's payout and count, observed and expected),
so a trip reports its window like a span does. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["NO_ARM", "Arm", "MinuteFigures", "step"]


@dataclass(frozen=True, slots=True)
class Arm:
    s: float = 0.0  # the statistic (log-likelihood ratio units); 0: no run
    start: int = -1  # the run's first minute
    obs: float = 0.0  # the run's observed payout (micros, uncapped)
    exp: float = 0.0  # expected payout
    var: float = 0.0  # variance of the payout
    cobs: float = 0.0  # observed and expected count
    cexp: float = 0.0


NO_ARM = Arm()


@dataclass(frozen=True, slots=True)
class MinuteFigures:
    """One minute as an arm sees it: the channel it tests, and the value and count for the
    run's totals. ``o``/``e``/``v``: the tested channel's observed (capped for value),
    expected (with the allowance) and variance. Expectations are NaN when unknown."""

    o: float
    e: float
    v: float
    value: float
    value_exp: float
    value_var: float
    count: float
    count_exp: float


def step(arm: Arm, shift: float, m: MinuteFigures, minute: int) -> Arm:
    """``arm`` after one (whole or partial) minute; unchanged when it has no expectation."""
    if not (m.e > 0 and m.v > 0) or math.isnan(m.value_exp) or math.isnan(m.count_exp):
        return arm
    phi = m.v / m.e
    s = arm.s + (m.o * math.log1p(shift) - shift * m.e) / phi
    if s <= 0:
        return NO_ARM
    if arm.s <= 0:
        return Arm(s, minute, m.value, m.value_exp, m.value_var, m.count, m.count_exp)
    return Arm(s, arm.start, arm.obs + m.value, arm.exp + m.value_exp, arm.var + m.value_var,
               arm.cobs + m.count, arm.cexp + m.count_exp)
