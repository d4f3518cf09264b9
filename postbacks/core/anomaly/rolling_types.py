"""The rolling detector's types: its policy, thresholds, state and results (:mod:`.rolling`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from postbacks.core.anomaly.cusum import Arm
from postbacks.core.anomaly.level import NO_LEVEL, Level
from postbacks.core.anomaly.profile import Profile, ProfileStats

__all__ = ["DEFAULT_SPANS", "ENDPOINT_ROLLING", "GLOBAL_ROLLING", "NO_PROFILE", "NoProfile",
           "RollingOver", "RollingPolicy", "RollingResult", "RollingState", "RollingThresholds",
           "RollingWithin", "SpanScore"]

DEFAULT_SPANS = (5, 15, 60)


@dataclass(frozen=True, slots=True)
class RollingPolicy:
    """Spans (minutes), trailing weeks per hour-of-week slot, samples needed, clip."""

    spans: tuple[int, ...] = DEFAULT_SPANS
    weeks: int = 4
    min_weeks: int = 2
    clip_sigmas: float = 4.0
    shifts: tuple[float, ...] = (0.5,)  # the count's CUSUM arms (:mod:`.cusum`)
    allowance: float = 2.0  # arms test expected x (1 + allowance x level deviation)
    conversion_cap: float = 0.0  # 0: off; else see :meth:`cap`

    def __post_init__(self) -> None:
        if not self.spans or any(not 1 <= s <= 24 * 60 for s in self.spans):
            raise ValueError(f"spans must be 1..1440 minutes: {self.spans}")
        if not 1 <= self.min_weeks <= self.weeks:
            raise ValueError(f"need 1 <= min_weeks <= weeks: {self.min_weeks}, {self.weeks}")
        if not self.clip_sigmas > 0:
            raise ValueError(f"clip_sigmas must be > 0: {self.clip_sigmas}")
        if any(not 0 < x <= 10 for x in self.shifts) or not self.allowance >= 0:
            raise ValueError(f"shifts must be in (0, 10], allowance >= 0: {self}")
        if not 0 <= self.conversion_cap <= 100:
            raise ValueError(f"conversion_cap must be in [0, 100]: {self.conversion_cap}")

    def cap(self, expected: float, variance: float, count: int = 0,
            expected_count: float = 0.0) -> float:
        """The most a minute counts in a score: expected + the larger of ``clip_sigmas``
        deviations and the expectation itself (so a large scope's surge is not capped
        below +100% a minute, while one large payout in a small minute is).

        With ``conversion_cap`` c > 0, a minute of ``count`` conversions also counts up to
        c times the slot's mean payout for each of them (``expected / expected_count``):
        one large payout stays capped, but a burst of ordinary ones counts in full. A
        sparse scope (an endpoint paid a few times an hour) needs this: its minute
        variance is so small that the sigma cap would hide ten conversions in a minute."""
        top = expected + max(self.clip_sigmas * math.sqrt(variance), expected)
        if self.conversion_cap and count and expected_count > 0:
            top = max(top, self.conversion_cap * count * expected / expected_count)
        return top

    @property
    def ring(self) -> int:
        """Closed minutes kept: the longest span less the open minute."""
        return max(self.spans) - 1


@dataclass(frozen=True, slots=True)
class RollingThresholds:
    """Trip when z > ``k_for(span)``, observed > ``multiple`` x expected, excess > floor.

    ``k_for(span) = k + skew / sqrt(span)``: a sum of few minutes of skewed payouts has a
    longer upper tail than a Gaussian (its skewness falls as 1/sqrt(span)), so a short
    span needs a higher score for the same false-trip rate.
    """

    k: float = 4.5
    skew: float = 3.0
    multiple: float = 1.1
    floor_micros: int = 50_000_000
    cv_floor: float = 0.02  # level variation assumed at least this (a short history)
    support_k: float = 2.0  # value score a count trip needs
    count_skew: float = 2.0  # counts carry no payout sizes: less skew than value
    cusum_h: float = 12.5  # a CUSUM arm trips above this (log-likelihood ratio)
    # An endpoint's single payout over this multiple of its peak (and over it by the
    # floor) is an outlier (.outlier); 0: not judged. The global scope does not use it.
    single_multiple: float = 5.0

    def __post_init__(self) -> None:
        if not (self.k > 0 and self.skew >= 0 and self.multiple >= 1
                and self.floor_micros >= 0 and self.cv_floor >= 0 and self.support_k >= 0
                and self.count_skew >= 0 and self.cusum_h > 0
                and (self.single_multiple == 0 or self.single_multiple >= 1)):
            raise ValueError(f"bad rolling thresholds: {self}")

    def k_for(self, span: int) -> float:
        return self.k + self.skew / math.sqrt(span)

    def count_k_for(self, span: int) -> float:
        return self.k + self.count_skew / math.sqrt(span)


GLOBAL_ROLLING = RollingThresholds(multiple=1.1, floor_micros=50_000_000)  # $50
# k 5.75: the highest needed k in 4 normal weeks of 150 endpoints was 5.18 over seeds 1-3
# of bench/containment_core.py --endpoints (k 5 false-tripped twice in seed 3), plus the
# calibration's margin; checked on seeds 4-6 (docs/detector.md#per-endpoint).
ENDPOINT_ROLLING = RollingThresholds(k=5.75, multiple=2.0, floor_micros=200_000_000)  # $200


@dataclass(frozen=True, slots=True)
class RollingState:
    """One scope's state. ``obs`` .. ``cvar`` are the closed minutes, oldest -> newest."""

    policy: RollingPolicy
    minute: int | None  # the open minute (minutes since the epoch); None until an event
    cur: int  # open minute's observed total (micros) and count
    ccur: int
    obs: tuple[int, ...]  # value: observed, capped at policy.cap, expected (NaN: none), var
    capped: tuple[float, ...]
    exp: tuple[float, ...]
    var: tuple[float, ...]
    cobs: tuple[int, ...]  # count: observed, expected, variance
    cexp: tuple[float, ...]
    cvar: tuple[float, ...]
    h_total: int  # open hour (minute // 60): payout, count, sums of squared minute values
    h_count: int
    h_sq: float
    h_csq: int
    profile: Profile
    st: ProfileStats  # value channel
    cst: ProfileStats  # count channel
    lv: Level = NO_LEVEL  # today's level, value channel (see :mod:`.level`)
    lc: Level = NO_LEVEL  # and count channel
    arms: tuple[Arm, ...] = ()  # one per policy shift; () all at zero
    arms_from: int = 0  # arms step only minutes from this one (a close re-arms them)


@dataclass(frozen=True, slots=True)
class SpanScore:
    """One span's numbers, for metrics and for the trip."""

    span: int  # minutes
    seen: int  # minutes covered (< span for a partial window)
    observed_micros: int
    expected_micros: float
    sigma_micros: float
    score: float  # (capped observed - expected) / sigma
    observed_count: int
    expected_count: float
    count_score: float
    arm: str = ""  # a CUSUM arm's trip ("count +50%"): span is its run, score its statistic


@dataclass(frozen=True, slots=True)
class RollingOver:
    """A span is over its thresholds (the first, shortest one that is)."""

    window_start_ms: int
    over: SpanScore
    scores: tuple[SpanScore, ...]


@dataclass(frozen=True, slots=True)
class RollingWithin:
    scores: tuple[SpanScore, ...]


@dataclass(frozen=True, slots=True)
class NoProfile:
    """No span has an expectation yet (a young scope): the rate cannot trip."""


NO_PROFILE = NoProfile()
RollingResult = RollingOver | RollingWithin | NoProfile
