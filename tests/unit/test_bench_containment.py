"""The containment bench's pure part (bench/containment_plan.py): which shapes a ``--shapes``
spec selects, where each starts in the shape week, the trip minute read from a trip's
reason, and the per-shape tally."""

from __future__ import annotations

from itertools import pairwise

import pytest

from bench.containment_plan import (
    CONTROLS,
    DAY_MIN,
    MIN_MS,
    compact,
    place,
    select,
    tally,
    trip_minute,
)


@pytest.mark.parametrize(("spec", "names"), [
    ("6h+50%", ["6h+50%trough", "6h+50%peak"]),
    ("40h+400%peak", ["40h+400%peak"]),
    ("control", ["controltrough", "controlpeak"]),
    ("6h+25%trough, control peak", ["6h+25%trough", "controlpeak"]),
    ("6h+25%,6h+25%trough", ["6h+25%trough", "6h+25%peak"]),
])
def test_a_spec_selects_shapes_by_name_prefix(spec: str, names: list[str]) -> None:
    assert [compact(s.name) for s in select(spec)] == names


def test_all_is_sixteen_shapes_and_two_controls() -> None:
    got = select("all")
    assert len(got) == 18 and got[-2:] == list(CONTROLS)
    assert len(select("6h")) == 8 and len(select("40h")) == 8


@pytest.mark.parametrize("spec", ["", "7h", "control,nope"])
def test_an_unknown_or_empty_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        select(spec)


def test_each_shape_gets_its_own_day_and_hour_of_week() -> None:
    week = 14 * DAY_MIN
    plan = place(select("6h,control"), week, busy_min=200)
    firsts = [p.first for p in plan]
    assert firsts == sorted(firsts)
    slots = {(p.first % (7 * DAY_MIN)) // 60 for p in plan}
    assert len(slots) == len(plan) == 10  # distinct hour-of-week slots
    for p in plan:
        assert (p.first - week) % DAY_MIN == p.shape.start_hour * 60
        assert week <= p.first < week + 7 * DAY_MIN
    gaps = [b - a for a, b in pairwise(firsts)]
    assert min(gaps) == 12 * 60


def test_placement_refuses_more_shapes_than_days_or_overlapping_shapes() -> None:
    with pytest.raises(ValueError, match="several runs"):
        place(select("all"), 0, busy_min=200)
    with pytest.raises(ValueError, match="occupies"):
        place(select("6h"), 0, busy_min=12 * 60)


@pytest.mark.parametrize(("reason", "start", "minutes"), [
    ("payout 10.00 USD over baseline 5.00 in window 600000 (5-min span (5 min seen): x)",
     600_000, 5),
    ("payout 1 USD over baseline 1 in window 900000 (15-min span (15 min seen): x)",
     600_000, 20),
    ("payout 1 USD over baseline 1 in window 600000 (60-min span (60 min seen): x)",
     4_140_000, 1),
    ("hourly: over in window 600000", 0, None),
    (None, 0, None),
])
def test_the_trip_minute_is_the_tripped_span_end(reason: str | None, start: int,
                                                 minutes: int | None) -> None:
    assert trip_minute(reason, start) == minutes
    assert MIN_MS == 60_000


def test_tally_counts_payout_dispatched_of_the_whole_cohort() -> None:
    sent = {"a": (100, False), "b": (200, True), "c": (300, False), "d": (400, True)}
    outcome = {"a": "dispatched", "b": "retrodated", "c": "halted_global",
               "d": "halted_global"}
    t = tally(sent, outcome, total_micros=2_000, unsent_open_micros=0)
    assert t.retro_sent == 2 and t.retro_held_pct == 50.0
    assert t.dispatched_pct == 5.0  # 100 of 2,000
    assert t.unsent_pct == 50.0  # 1,000 never sent


def test_tally_counts_unsent_open_payout_as_dispatched_when_nothing_tripped() -> None:
    sent = {"a": (100, False)}
    t = tally(sent, {"a": "dispatched"}, total_micros=400, unsent_open_micros=200)
    assert t.retro_held_pct is None and t.dispatched_pct == 75.0
    assert tally({}, {}, 0, 0).dispatched_pct == 0.0
