"""Partition partials, and broad-but-shallow tripping the global scope only (the aggregator's
roll-up arithmetic is tested against the real aggregator in test_gate_engine.py)."""

from __future__ import annotations

import pytest

from postbacks.core.anomaly.baseline import SeasonalBaseline, add, close_until, empty
from postbacks.core.anomaly.detectors import (
    ENDPOINT_THRESHOLDS,
    GLOBAL_THRESHOLDS,
    WITHIN,
    Over,
    value_rate,
)
from postbacks.core.anomaly.modes import (
    Detector,
    GateModes,
    Hold,
    HoldReason,
    Mode,
    Trip,
    decide,
)
from postbacks.core.anomaly.rollup import (
    PartitionPartial,
    accumulate,
)
from postbacks.core.anomaly.windows import HOUR_MS, WEEK_MS

MON9 = 1_772_409_600_000 + 9 * HOUR_MS
W1, W2 = MON9, MON9 + HOUR_MS
USD = 1_000_000


@pytest.mark.parametrize(("events", "expected"), [
    ([(W1, 5)], PartitionPartial(W1, 5, 1)),
    ([(W1, 5), (W1 + 10, 7)], PartitionPartial(W1, 12, 2)),
    ([(W1, 5), (W2, 7)], PartitionPartial(W2, 7, 1)),
    ([(W2, 5), (W1, 7)], PartitionPartial(W2, 12, 2)),  # late: counts in the current window
])
def test_partition_partial(events: list[tuple[int, int]], expected: PartitionPartial) -> None:
    p = PartitionPartial()
    for ts, pay in events:
        p = accumulate(p, ts, pay)
    assert p == expected


N_ENDPOINTS, N_PARTITIONS = 40, 4
NORMAL = 100 * USD  # each endpoint: $100 in the Monday 09:00 hour


def _trained(total: int) -> SeasonalBaseline:
    s = empty()
    for k in range(4):
        s = add(s, MON9 + k * WEEK_MS, total)
    return close_until(s, MON9 + 4 * WEEK_MS)


def test_broad_but_shallow_trips_global_and_no_endpoint() -> None:
    """40 endpoints each +50% (well under x3 and under the $500 floor); the sum is $6,000
    against a $4,000 global baseline: over x1.25 and the $5,000 floor."""
    now = MON9 + 4 * WEEK_MS
    endpoints = {f"ep_{i}": _trained(NORMAL) for i in range(N_ENDPOINTS)}
    g = _trained(N_ENDPOINTS * NORMAL)
    parts = [PartitionPartial() for _ in range(N_PARTITIONS)]
    modes = GateModes(Mode.ENFORCE, Mode.ENFORCE, Mode.ENFORCE)
    decisions = []
    for step in range(6):  # six rounds of $25 to every endpoint: +50% by the end
        for i, ep in enumerate(endpoints):
            ts = now + step * 600_000 + i
            endpoints[ep] = add(endpoints[ep], ts, 25 * USD)
            ep_rate = value_rate(endpoints[ep], ENDPOINT_THRESHOLDS)
            assert ep_rate is WITHIN
            pn = i % N_PARTITIONS  # the gate: partition partials ...
            before = sum(x.total for x in parts)
            parts[pn] = accumulate(parts[pn], ts, 25 * USD)
            g = add(g, ts, sum(x.total for x in parts) - before)  # ... the global increase
            decisions.append(decide(ep, modes, False, ep_rate, value_rate(g, GLOBAL_THRESHOLDS)))
    ep_sum = sum(s.open_total for s in endpoints.values())
    assert sum(x.total for x in parts) == g.open_total == ep_sum == 40 * 150 * USD
    held = [d for d in decisions if isinstance(d, Hold)]
    assert held and all(d.reason is HoldReason.PAYOUT_RATE_GLOBAL for d in held)
    first = held[0].trips[0]
    assert first.scope == "global" and first.detector is Detector.VALUE_RATE
    assert first.observed > 5_000 * USD and first.baseline == 4_000.0 * USD
    assert all(t.scope == "global" for d in held for t in d.trips)
    # the last round pushes global to $6,000 (= 1.5 x the baseline)
    assert value_rate(g, GLOBAL_THRESHOLDS) == Over(now, 6_000 * USD, 4_000.0 * USD)
    assert isinstance(first, Trip)
