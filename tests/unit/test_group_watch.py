"""When a consumer counts as fallen out of its group for good (the watch's rule)."""

from __future__ import annotations

from postbacks.kafka.watchdog import orphaned


def test_orphaned_only_when_unassigned_past_the_limit_and_the_group_is_empty() -> None:
    assert orphaned(121.0, 0, 120.0)
    assert not orphaned(None, 0, 120.0)  # holding partitions
    assert not orphaned(119.0, 0, 120.0)  # not long enough
    assert not orphaned(121.0, 1, 120.0)  # a member without partitions: an idle instance
    assert not orphaned(121.0, None, 120.0)  # the broker could not be asked
