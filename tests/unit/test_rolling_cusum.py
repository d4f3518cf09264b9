"""The CUSUM arms of the rolling detector: the pure step, and the arms inside the state."""

from __future__ import annotations

import dataclasses
import math

import pytest

from postbacks.core.anomaly.cusum import NO_ARM, Arm, MinuteFigures, step
from postbacks.core.anomaly.level import NO_LEVEL, Level
from postbacks.core.anomaly.rolling import (
    RollingOver,
    RollingResult,
    RollingState,
    RollingThresholds,
    add,
    arm_scores,
    evaluate,
    reset_arms,
)
from postbacks.core.anomaly.rolling_codec import from_dict, to_dict
from tests.unit.test_rolling_windows import MIN, MON_MIN, state_with

NAN = float("nan")
ARMS_ONLY = RollingThresholds(k=1e9)  # the spans never trip: what trips is an arm


def fig(o: float, e: float, v: float | None = None) -> MinuteFigures:
    return MinuteFigures(o, e, e if v is None else v, o * 1e6, e * 1e6, e * 1e12, o, e)


def run(shift: float, figures: list[MinuteFigures]) -> Arm:
    arm = NO_ARM
    for i, f in enumerate(figures):
        arm = step(arm, shift, f, 1000 + i)
    return arm


@pytest.mark.parametrize(("shift", "o", "e", "v", "minutes", "expected_s"), [
    (0.5, 100, 100, 100, 60, 0.0),  # at the expectation: never leaves zero
    (0.5, 110, 100, 100, 60, 0.0),  # +10%, under half the shift: still zero
    (0.25, 110, 100, 100, 60, 0.0),  # +10% against +25%: (110 ln 1.25 - 25) < 0
    (0.5, 150, 100, 100, 3, 3 * (150 * math.log(1.5) - 50)),  # the shift itself
    (0.5, 150, 100, 200, 3, 3 * (150 * math.log(1.5) - 50) / 2),  # twice the dispersion
    (0.25, 200, 100, 100, 2, 2 * (200 * math.log(1.25) - 25)),
])
def test_the_statistic_is_the_quasi_poisson_likelihood_ratio(
        shift: float, o: float, e: float, v: float, minutes: int, expected_s: float) -> None:
    arm = run(shift, [fig(o, e, v)] * minutes)
    assert arm.s == pytest.approx(expected_s)
    if expected_s:
        assert (arm.start, arm.cobs, arm.cexp) == (1000, o * minutes, e * minutes)
        assert arm.obs == pytest.approx(o * 1e6 * minutes)
    else:
        assert arm == NO_ARM


def test_a_quiet_minute_ends_the_run_and_the_next_run_starts_afresh() -> None:
    arm = run(0.5, [fig(150, 100)] * 2 + [fig(0, 100)] + [fig(150, 100)])
    assert arm.start == 1003 and arm.cobs == 150
    assert arm.s == pytest.approx(150 * math.log(1.5) - 50)


@pytest.mark.parametrize("f", [fig(150, NAN), fig(150, 0), fig(150, 100, 0),
                               MinuteFigures(150, 100, 100, 1.0, NAN, 0.0, 150, 100)])
def test_a_minute_without_an_expectation_leaves_the_arm_as_it_was(f: MinuteFigures) -> None:
    before = run(0.5, [fig(150, 100)])
    assert step(before, 0.5, f, 2000) == before


def flat(hour: int) -> float:  # $6,000 an hour every hour: 100 conversions of $1 a minute
    return 6_000_000_000.0


LEARNED = Level(a=6000.0, b=6000.0, v=6000.0, r_num=0.0, r_den=100.0)  # today: as usual


def surge(minutes: int, count: int, micros_each: int = 1_000_000,
          first: int = MON_MIN + 10 * 7 * 1440,
          level: Level = LEARNED) -> tuple[RollingState, list[RollingResult]]:
    """Feed ``minutes`` minutes of ``count`` conversions; the results after each minute."""
    s = dataclasses.replace(state_with(flat), lc=level)
    out = []
    for i in range(minutes):
        m = first + i
        for _ in range(count):
            s = add_one(s, m, micros_each)
        out.append(evaluate(s, ARMS_ONLY))
    return s, out


def add_one(s: RollingState, minute: int, micros: int) -> RollingState:
    return add(s, minute * MIN + 1_000, micros)


def test_a_sustained_count_surge_with_its_money_trips_an_arm_within_minutes() -> None:
    _, results = surge(6, 150)
    first = next(i for i, r in enumerate(results) if isinstance(r, RollingOver))
    over = results[first]
    assert isinstance(over, RollingOver)
    assert 1 <= first <= 3, first  # one minute of +50% is not enough, three are
    assert over.over.arm.startswith("count +") and over.over.score > ARMS_ONLY.cusum_h
    assert over.over.span == first + 1 and over.over.observed_count == 150 * (first + 1)
    assert over.window_start_ms == (MON_MIN + 10 * 7 * 1440) * MIN


def test_the_arms_wait_until_todays_level_is_learned() -> None:
    s, results = surge(10, 150, level=NO_LEVEL)
    assert all(a.s == 0 for a in s.arms) and not any(isinstance(r, RollingOver) for r in results)


def test_a_small_excess_never_trips_an_arm() -> None:
    s, results = surge(240, 106)  # +6%, 4 hours
    assert not any(isinstance(r, RollingOver) for r in results)
    assert all(sc.score < ARMS_ONLY.cusum_h for sc in arm_scores(s))


def test_more_conversions_without_more_money_do_not_trip() -> None:
    _, results = surge(30, 150, micros_each=600_000)  # +50% count, -10% payout
    assert not any(isinstance(r, RollingOver) for r in results)


def test_arms_off_no_trip() -> None:
    s, _ = surge(6, 150)
    off = dataclasses.replace(ARMS_ONLY, cusum_h=math.inf)
    assert not isinstance(evaluate(s, off), RollingOver)


def test_a_close_resets_the_arms_and_only_a_new_run_trips_again() -> None:
    s, results = surge(4, 150)
    assert isinstance(results[-1], RollingOver)
    minute = s.minute
    assert minute is not None
    s = reset_arms(s, minute + 1)
    assert s.arms == () and not isinstance(evaluate(s, ARMS_ONLY), RollingOver)
    tripped = None
    for i in range(1, 6):
        for _ in range(150):
            s = add_one(s, minute + i, 1_000_000)
        r = evaluate(s, ARMS_ONLY, since_minute=minute + 1)
        if isinstance(r, RollingOver):
            tripped = r
            break
    assert tripped is not None and tripped.window_start_ms >= (minute + 1) * MIN


def test_arms_round_trip_through_the_changelog_and_an_older_state_starts_them_at_zero() -> None:
    s, _ = surge(2, 150)
    d = to_dict(s)
    assert d["arms"] and to_dict(from_dict(d)) == d
    back = from_dict(d)
    assert back.arms == s.arms and back.policy == s.policy
    old = {k: v for k, v in d.items() if k not in ("arms", "shifts", "allowance", "arms_from")}
    restored = from_dict(old)
    assert restored.arms == () and restored.arms_from == 0
    assert restored.policy.shifts == s.policy.shifts


@pytest.mark.parametrize(("change", "message"), [
    ({"arms": "1.0,2,3"}, "bad arm"),
    ({"arms": "1.0,1000,1,1,1,1,1;0,0,0,0,0,0,0"}, "2 arms, expected 1"),
    ({"arms": "nan,1000,1,1,1,1,1"}, "bad arm"),
    ({"shifts": "0"}, "shifts"),
])
def test_malformed_arms_are_refused(change: dict[str, object], message: str) -> None:
    s, _ = surge(2, 150)
    with pytest.raises(ValueError, match=message):
        from_dict({**to_dict(s), **change})
