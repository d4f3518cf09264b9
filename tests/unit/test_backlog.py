"""Lag and backlog age from partition progress (the monitor's arithmetic)."""

from __future__ import annotations

import pytest

from postbacks.core.backlog import PartitionProgress, backlog_ages, lag_of, position_of

NOW = 1_800_000_000_000


def _p(committed: int | None, start: int, end: int, oldest: int | None = None, *,
       topic: str = "t", partition: int = 0, group: str = "g",
       due: int | None = None) -> PartitionProgress:
    return PartitionProgress(group, topic, partition, committed, start, end, oldest, due)


@pytest.mark.parametrize(("committed", "start", "end", "position", "lag"), [
    (10, 0, 15, 10, 5),      # behind by five
    (15, 0, 15, 15, 0),      # caught up
    (None, 0, 15, 0, 15),    # no committed offset: reads from the start
    (None, 7, 7, 7, 0),      # ... of an empty (retained-away) log
    (3, 7, 15, 7, 8),        # retention deleted past the offset: resumes at the start
    (20, 0, 15, 20, 0),      # an end read before the commit landed: never negative
])
def test_position_and_lag(committed: int | None, start: int, end: int, position: int,
                          lag: int) -> None:
    p = _p(committed, start, end)
    assert (position_of(p), lag_of(p)) == (position, lag)


@pytest.mark.parametrize(("parts", "ages"), [
    ([_p(10, 0, 15, NOW - 30_000)], {("g", "t"): 30.0}),
    # the oldest of the topic's partitions counts
    ([_p(10, 0, 15, NOW - 30_000), _p(5, 0, 9, NOW - 90_000, partition=1)],
     {("g", "t"): 90.0}),
    # a caught-up partition says 0, whatever it was last told
    ([_p(15, 0, 15, NOW - 30_000)], {("g", "t"): 0.0}),
    # lagging but nothing readable there (transaction markers only): 0
    ([_p(14, 0, 15, None)], {("g", "t"): 0.0}),
    # a broker clock ahead of ours: never negative
    ([_p(10, 0, 15, NOW + 5_000)], {("g", "t"): 0.0}),
    # groups and topics apart
    ([_p(1, 0, 2, NOW - 1_000), _p(1, 0, 2, NOW - 2_000, group="h"),
      _p(1, 0, 2, NOW - 3_000, topic="u")],
     {("g", "t"): 1.0, ("h", "t"): 2.0, ("g", "u"): 3.0}),
    # a delay-topic record counts from its due_at: not yet due, no backlog ...
    ([_p(10, 0, 15, NOW - 600_000, due=NOW + 60_000)], {("g", "t"): 0.0}),
    # ... past due by 45 s: 45 s old, however long it waited before
    ([_p(10, 0, 15, NOW - 600_000, due=NOW - 45_000)], {("g", "t"): 45.0}),
    # a due_at before the record was written (re-queued late): from when it was written
    ([_p(10, 0, 15, NOW - 20_000, due=NOW - 900_000)], {("g", "t"): 20.0}),
    ([], {}),
])
def test_backlog_age_is_the_oldest_unfinished_record(parts: list[PartitionProgress],
                                                    ages: dict[tuple[str, str], float]) -> None:
    assert backlog_ages(parts, NOW) == ages


def test_the_age_grows_while_the_position_stands_still() -> None:
    stalled = [_p(10, 0, 15, NOW - 10_000)]
    assert backlog_ages(stalled, NOW)[("g", "t")] < backlog_ages(stalled, NOW + 60_000)[("g", "t")]
