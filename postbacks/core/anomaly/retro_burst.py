"""The retrodated burst: many retrodated deliveries in a few event-time minutes halt the
global scope.

The retrodating guard holds each retrodated delivery, but an upstream fault rarely makes
only retrodated conversions: IR-307's cohort was 30,083 conversions, 8,797 of them
retrodated, and the other 21,286 were paid. A burst of retrodated deliveries is the
earliest sign of such a cohort, long before its money moves a value rate. Under the
global retrodating row's ``enforce``, the aggregator halts the global scope when the
retrodated deliveries of the last ``span`` minutes (the open minute included, as far as
it is known) are

- at least ``floor`` (the row's ``burst_count``; absent or 0: the burst is off),
- over twice the usual count for ``span`` minutes, and
- over the usual count plus ``k`` Poisson deviations (at least one).

The usual count is an exponentially weighted mean per minute (time constant a week) of
the minutes that have left the span, so the burst being judged never raises its own
baseline; a week of steady late approvals raises it, and the floor stays. Minutes closed
while the scope is halted teach it nothing, and at a close the span's minutes are
forgotten: an incident never becomes the usual. After a close the span counts only
minutes after it, as the rolling spans do.

The usual rate starts from nothing: it is the weighted mean of the minutes seen so far
(the exponential mean divided by the weight it has gathered), so the first day's
late approvals count as usual from the start, not as a burst over a rate of zero.

Opt-in: a global retrodating row without ``burst_count`` keeps the burst off, since
arming the guard must not also arm a halt of every delivery.

Pure: the aggregator (``streams/anomaly_gate/aggregate.py``) keeps a :class:`BurstState`
in its changelog state and feeds it each closed minute's count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "BURST",
    "NO_BURST",
    "SUGGESTED_COUNT",
    "BurstPolicy",
    "BurstResult",
    "BurstState",
    "close_minute",
    "forget_span",
    "format_burst",
    "judge",
    "parse_burst",
]


@dataclass(frozen=True, slots=True)
class BurstPolicy:
    span: int = 15  # minutes
    floor: int = 0  # retrodated deliveries in the span, at least; 0: the burst is off
    k: float = 5.0  # Poisson deviations over the usual count
    multiple: float = 2.0  # and over this multiple of it
    tau_min: float = 7 * 1440.0  # the usual rate's time constant

    def __post_init__(self) -> None:
        if not 1 <= self.span <= 1440 or self.floor < 0 or self.k < 0 or self.multiple < 1:
            raise ValueError(f"bad retrodated burst policy: {self}")


BURST = BurstPolicy()  # the defaults: off
SUGGESTED_COUNT = 50  # what the docs and the bench set ``burst_count`` to


@dataclass(frozen=True, slots=True)
class BurstState:
    minute: int | None = None  # the newest closed minute
    ring: tuple[int, ...] = ()  # counts of the closed minutes in the span, oldest first
    rate: float = 0.0  # exponential mean of the minutes that left the span (biased to 0)
    weight: float = 0.0  # the weight ``rate`` has gathered: 1 - exp(-minutes / tau)

    def usual(self) -> float:
        """Usual retrodated deliveries per minute: ``rate`` without its start-up bias."""
        return self.rate / self.weight if self.weight > 0 else 0.0


NO_BURST = BurstState()


@dataclass(frozen=True, slots=True)
class BurstResult:
    observed: int  # retrodated deliveries in the span
    usual: float  # what the span usually holds
    threshold: float  # the count the span must reach (floor, multiple and deviations)
    seen: int  # minutes the span covers (fewer after a close)

    @property
    def over(self) -> bool:
        return self.threshold > 0 and self.observed >= self.threshold

    def describe(self) -> str:
        return (f"{self.seen}-min span (retrodated burst): {self.observed} retrodated "
                f"deliveries against {self.usual:.1f} usual, threshold {self.threshold:.0f}")


def _leave(rate: float, weight: float, count: int,
           policy: BurstPolicy) -> tuple[float, float]:
    a = math.exp(-1.0 / policy.tau_min)
    return rate * a + count * (1.0 - a), weight * a + (1.0 - a)


def close_minute(s: BurstState, minute: int, count: int, policy: BurstPolicy,
                 learn: bool = True) -> BurstState:
    """Minute ``minute`` closes with ``count`` retrodated deliveries (the minutes between
    the last closed one and it closed with none). A minute not after the newest closed one
    (late money) counts in the newest. ``learn`` False (the scope is halted): the minutes
    leaving the span teach the usual rate nothing."""
    keep = policy.span - 1  # the open minute is the span's last
    if s.minute is not None and minute <= s.minute:
        late = (*s.ring[:-1], s.ring[-1] + count) if s.ring else (count,)
        return BurstState(s.minute, late, s.rate, s.weight)
    gap = 0 if s.minute is None else minute - s.minute - 1
    ring, rate, weight = list(s.ring), s.rate, s.weight
    for _ in range(min(gap, keep + 1)):
        ring.append(0)
    ring.append(count)
    while len(ring) > keep:
        left = ring.pop(0)
        if learn:
            rate, weight = _leave(rate, weight, left, policy)
    if gap > keep + 1 and learn:  # minutes that left without ever entering the ring: zeros
        a = math.exp(-(gap - keep - 1) / policy.tau_min)
        rate, weight = rate * a, weight * a + (1.0 - a)
    return BurstState(minute, tuple(ring), rate, weight)


def judge(s: BurstState, open_minute: int | None, open_count: int, policy: BurstPolicy,
          since_minute: int | None = None) -> BurstResult:
    """The span ending at ``open_minute`` (its count so far ``open_count``; None: the span
    ends at the newest closed minute). ``since_minute``: no minute before it counts."""
    if policy.floor == 0:
        return BurstResult(0, 0.0, 0.0, 0)
    end = open_minute if open_minute is not None else s.minute
    if end is None:
        return BurstResult(open_count, 0.0, float(policy.floor), 1)
    first = end - policy.span + 1
    if s.minute is not None:  # a span reaching back before the first minute known
        first = max(first, min(end, s.minute - len(s.ring) + 1))
    elif open_minute is not None:
        first = open_minute
    if since_minute is not None:
        first = max(first, since_minute)
    observed = open_count if open_minute is not None and open_minute >= first else 0
    if s.minute is not None:
        for i, c in enumerate(reversed(s.ring)):
            m = s.minute - i
            if first <= m <= end and (open_minute is None or m < open_minute):
                observed += c
    seen = max(1, end - first + 1)
    usual = s.usual() * seen
    threshold = max(float(policy.floor), policy.multiple * usual,
                    usual + policy.k * math.sqrt(max(usual, 1.0)))
    return BurstResult(observed, usual, threshold, seen)


def forget_span(s: BurstState) -> BurstState:
    """At a close: the span's minutes (the incident's) are judged no more, and must not
    teach the usual rate when they leave it."""
    return BurstState(s.minute, (0,) * len(s.ring), s.rate, s.weight)


def format_burst(s: BurstState) -> str:
    """The state as a string for the aggregator's changelog value."""
    ring = ",".join(str(c) for c in s.ring)
    return f"{'' if s.minute is None else s.minute}|{ring}|{s.rate!r}|{s.weight!r}"


def parse_burst(raw: object) -> BurstState:
    if not isinstance(raw, str):
        raise ValueError("retrodated burst: not a string")
    parts = raw.split("|")
    if len(parts) != 4:
        raise ValueError(f"retrodated burst: bad value {raw!r}")
    try:
        minute = int(parts[0]) if parts[0] else None
        ring = tuple(int(c) for c in parts[1].split(",")) if parts[1] else ()
        rate, weight = float(parts[2]), float(parts[3])
    except ValueError:
        raise ValueError(f"retrodated burst: bad value {raw!r}") from None
    if (not all(math.isfinite(x) and x >= 0 for x in (rate, weight)) or weight > 1
            or any(c < 0 for c in ring)):
        raise ValueError(f"retrodated burst: bad value {raw!r}")
    return BurstState(minute, ring, rate, weight)
