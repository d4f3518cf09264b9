"""Endpoint scopes for ``bench/containment_core.py --endpoints``: one rolling detector per
endpoint, fed the endpoint's own minutes, evaluated after every minute it had a payout.

It counts the endpoint scopes' false trips in the normal weeks and in the control (an
endpoint trip under enforce holds that endpoint's deliveries, so it is a false hold too),
keeps every endpoint's state at the cohorts' starts, and, per cohort, replays the member
endpoints' normal minutes plus their share of the cohort for up to 6 hours: how many of
them their own detector would have tripped, and the first minute one did. Slow (several
minutes a seed at the default scale): every endpoint is evaluated after each of its
minutes, as the gate would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from postbacks.core.anomaly.recommend import needed_k
from postbacks.core.anomaly.rolling import (
    RollingOver,
    RollingPolicy,
    RollingState,
    RollingThresholds,
    add,
    describe,
    empty,
    evaluate,
)

MIN_MS = 60_000
Minute = dict[int, tuple[int, int]]  # endpoint -> (payout micros, count)


@dataclass
class Endpoints:
    th: RollingThresholds
    policy: RollingPolicy
    start_ms: int
    normal_from: int  # first minute of the normal weeks
    tail_from: int  # first minute of the control / cohort days
    snap_at: tuple[int, ...]  # minutes at whose start every state is kept
    states: dict[int, RollingState] = field(default_factory=dict)
    tripped: dict[int, bool] = field(default_factory=dict)
    normal_trips: int = 0
    control_trips: int = 0
    false_trips: list[str] = field(default_factory=list)  # what tripped, for the report
    # the highest k at or below which a span would have tripped in the normal weeks (what
    # ``postbacks anomaly calibrate --scope endpoint`` recommends from, less the margin)
    needed: tuple[float, str] = (0.0, "none")
    snaps: dict[int, dict[int, RollingState]] = field(default_factory=dict)
    tail: list[Minute] = field(default_factory=list)

    def minute(self, m: int, per_ep: Minute) -> None:
        if m in self.snap_at:
            self.snaps[m] = dict(self.states)  # states are immutable: a shallow copy
        if m >= self.tail_from:
            self.tail.append(per_ep)
        blank = empty(self.policy)
        for ep, (value, n) in per_ep.items():
            st = add(self.states.get(ep, blank), self.start_ms + m * MIN_MS, value, n)
            self.states[ep] = st
            if m < self.normal_from:
                continue
            r = evaluate(st, self.th)
            for sc in getattr(r, "scores", ()):
                got = needed_k(sc, self.th)
                if got is not None and got[0] > self.needed[0]:
                    self.needed = (got[0], f"endpoint {ep}, minute {m}, {sc.span}-min span, "
                                           f"{got[1]}")
            over = isinstance(r, RollingOver)
            if over and not self.tripped.get(ep, False):
                if m >= self.tail_from:
                    self.control_trips += 1
                else:
                    self.normal_trips += 1
                assert isinstance(r, RollingOver)
                self.false_trips.append(f"endpoint {ep}, minute {m}: {describe(r)}")
            self.tripped[ep] = over

    def cohort(self, first: int, extra: list[Minute]) -> tuple[int, int | None]:
        """Members tripped by their own detector, and the first such minute (1-based)."""
        states = dict(self.snaps[first])
        blank = empty(self.policy)
        members = {ep for minute in extra for ep in minute}
        hit: set[int] = set()
        first_hit: int | None = None
        for j, add_on in enumerate(extra):
            m = first + j
            normal = self.tail[m - self.tail_from]
            for ep in members:
                v, n = normal.get(ep, (0, 0))
                dv, dn = add_on.get(ep, (0, 0))
                if not (v or n or dv or dn):
                    continue
                st = add(states.get(ep, blank), self.start_ms + m * MIN_MS, v + dv, n + dn)
                states[ep] = st
                if ep not in hit and isinstance(evaluate(st, self.th), RollingOver):
                    hit.add(ep)
                    if first_hit is None:
                        first_hit = j + 1
        return len(hit), first_hit
