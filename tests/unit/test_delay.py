from __future__ import annotations

import pytest

from postbacks.core.delay import is_due, wait_s


@pytest.mark.parametrize(("due", "now", "expected"),
                         [(None, 5, True), (5, 5, True), (4, 5, True), (6, 5, False)])
def test_never_early(due: int | None, now: int, expected: bool) -> None:
    assert is_due(due, now) is expected


@pytest.mark.parametrize(("dues", "now", "expected"),
                         [([], 0, 0.5), ([10_000], 0, 0.5), ([100], 0, 0.1), ([300, 50], 0, 0.05),
                          ([0], 10, 0.0)])
def test_poll_waits_no_longer_than_the_earliest_paused_head(
    dues: list[int], now: int, expected: float
) -> None:
    assert wait_s(dues, now) == pytest.approx(expected)
