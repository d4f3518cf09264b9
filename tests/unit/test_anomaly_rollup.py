"""Partition partials (the aggregator's roll-up arithmetic is tested against the real
aggregator in test_gate_aggregate.py; broad-but-shallow cohorts tripping the global scope
in bench/containment_core.py and tests/e2e/test_anomaly_scenario.py)."""

from __future__ import annotations

import pytest

from postbacks.core.anomaly.rollup import (
    PartitionPartial,
    accumulate,
)
from postbacks.core.anomaly.windows import HOUR_MS

MON9 = 1_772_409_600_000 + 9 * HOUR_MS
W1, W2 = MON9, MON9 + HOUR_MS


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
