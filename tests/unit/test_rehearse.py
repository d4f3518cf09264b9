"""The rehearsal's pacing and tagging (streams/anomaly_gate/rehearse.py), on a fake clock."""

from __future__ import annotations

from streams.anomaly_gate.rehearse import Pacer, _tagged
from tests.unit.factories import make_conversion


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.now += s


def test_events_are_due_at_their_event_time_over_the_speedup() -> None:
    c = FakeClock()
    p = Pacer(3600.0, clock=c.clock, sleep=c.sleep)
    assert p.wait_for(1_000_000) == 0.0  # the first event starts the run
    assert p.wait_for(1_000_000 + 3_600_000) == 0.0  # an hour later: 1 s later
    assert c.slept == [1.0]
    c.now += 2.5  # the producer fell behind by 2.5 s
    assert p.wait_for(1_000_000 + 2 * 3_600_000) == 1.5
    assert c.slept == [1.0]
    assert p.wait_for(1_000_000) == 3.5  # out of order: late by its age, sent at once
    assert c.slept == [1.0]


def test_speedup_zero_never_sleeps() -> None:
    c = FakeClock()
    p = Pacer(0.0, clock=c.clock, sleep=c.sleep)
    for t in (0, 10**9, 2 * 10**9):
        assert p.wait_for(t) == 0.0
    assert c.slept == []


def test_a_tag_makes_a_fresh_run_without_touching_the_history() -> None:
    ev = make_conversion(conversion_id="cv_1", event_id="evt_1")
    t = _tagged(ev, "r2")
    assert (t["conversion_id"], t["event_id"]) == ("cv_1_r2", "evt_1_r2")
    assert ev["conversion_id"] == "cv_1" and _tagged(ev, None) is ev
