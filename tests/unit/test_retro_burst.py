"""The retrodated burst (postbacks/core/anomaly/retro_burst.py): the span's count against
the floor, the usual rate's multiple and its Poisson deviations; minutes leaving the span
teach the usual rate; a close starts the span again."""

from __future__ import annotations

import math

import pytest

from postbacks.core.anomaly.retro_burst import (
    NO_BURST,
    BurstPolicy,
    BurstState,
    close_minute,
    format_burst,
    judge,
    parse_burst,
)

P = BurstPolicy(floor=50)  # 15 minutes, floor 50, k 5, multiple 2, a week


def _fed(counts: list[int], first: int = 1000, policy: BurstPolicy = P) -> BurstState:
    s = NO_BURST
    for i, c in enumerate(counts):
        s = close_minute(s, first + i, c, policy)
    return s


@pytest.mark.parametrize(("closed", "open_count", "over"), [
    ([0] * 14, 49, False),  # under the floor
    ([0] * 14, 50, True),  # the floor, in the open minute alone
    ([4] * 14, 0, True),  # 56 over 14 closed minutes
    ([3] * 14, 7, False),  # 49
    ([100] + [0] * 14, 0, False),  # the 100 left the span a minute ago
])
def test_the_span_against_the_floor(closed: list[int], open_count: int, over: bool) -> None:
    s = _fed(closed)
    r = judge(s, 1000 + len(closed), open_count, P)
    assert r.over is over, r
    assert r.seen == 15


def test_the_usual_rate_is_learnt_from_minutes_that_left_the_span() -> None:
    s = _fed([10] * (20 * 1440))  # 20 days of 10 a minute: late approvals are normal here
    assert s.usual() == pytest.approx(10, rel=0.01)
    r = judge(s, 1000 + 20 * 1440, 10, P)
    assert r.usual == pytest.approx(150, rel=0.1)
    # twice the usual, and 5 deviations over it: about 300
    assert r.threshold == pytest.approx(max(2 * r.usual, r.usual + 5 * math.sqrt(r.usual)))
    assert not r.over
    burst = _fed([10] * (20 * 1440) + [30] * 14)
    assert judge(burst, 1000 + 20 * 1440 + 14, 30, P).over


def test_a_gap_closes_as_zeros_and_late_counts_land_in_the_newest_minute() -> None:
    s = close_minute(_fed([5, 5]), 1010, 7, P)  # minutes 1002..1009 closed with none
    assert s.minute == 1010 and s.ring == (5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 7)
    late = close_minute(s, 1003, 2, P)
    assert late.ring[-1] == 9 and late.minute == 1010
    far = close_minute(s, 1010 + 10 * 1440, 1, P)  # ten days later: the ring is zeros
    assert far.ring == (0,) * 13 + (1,) and far.usual() < 0.01


def test_a_close_starts_the_span_again() -> None:
    s = _fed([10] * 14)
    assert judge(s, 1014, 0, P).over
    r = judge(s, 1014, 3, P, since_minute=1012)  # minutes 1012, 1013 and the open one
    assert (r.observed, r.seen, r.over) == (23, 3, False)


def test_off_when_the_floor_is_0() -> None:
    off = BurstPolicy(floor=0)
    r = judge(_fed([100] * 14, policy=off), 1014, 100, off)
    assert not r.over and r.threshold == 0


def test_the_state_round_trips_and_bad_values_are_refused() -> None:
    s = _fed([1, 2, 3])
    assert parse_burst(format_burst(s)) == s
    assert parse_burst(format_burst(NO_BURST)) == NO_BURST
    for bad in (None, "1|2", "x|1|0.0", "1|-1|0.0", "1|1|nan", "1|1|-2.0"):
        with pytest.raises(ValueError):
            parse_burst(bad)


def test_describe_names_the_span_and_the_counts() -> None:
    r = judge(_fed([4] * 14), 1014, 6, P)
    assert r.describe() == ("15-min span (retrodated burst): 62 retrodated deliveries "
                            "against 0.0 usual, threshold 50")


def test_the_usual_rate_has_no_start_up_bias() -> None:
    """Four late approvals a minute from the start: usual from the first hour on, never a
    burst over a rate of zero (the exponential mean alone would read 0.02 after an hour)."""
    s = NO_BURST
    for m in range(3 * 1440):
        s = close_minute(s, m, 4, P)
        if m >= 15:
            assert not judge(s, m + 1, 4, P).over, m
    assert s.usual() == pytest.approx(4)
    assert judge(_fed([4] * 60), 1060, 4, P).usual == pytest.approx(60)


def test_the_default_policy_is_off() -> None:
    assert BurstPolicy().floor == 0
    assert not judge(_fed([100] * 14), 1014, 100, BurstPolicy()).over
