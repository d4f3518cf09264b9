"""The anomaly control topic is "latest change wins": a state dated far ahead of the clock
(closed, 2**62) used to win over every later trip, the gate's own and PostgreSQL's, so one
record switched a scope's halts off for good. Such a state, or one naming no detector, is
refused; and a trip is never dated before the change it follows."""

from __future__ import annotations

from typing import Any

from postbacks.core.anomaly import Detector, HaltState, Trip
from streams.anomaly_gate.config import HaltBook, StateChange
from streams.anomaly_gate.control import MAX_AHEAD_MS, refused

NOW = 1_800_000_000_000
SCOPE = ("endpoint", "ep_1")


def state(**over: Any) -> Any:
    rec = {"scope": "endpoint", "scope_key": "ep_1", "detector": "value_rate",
           "state": "closed", "changed_at": NOW, "reason": None, "actor": "x",
           "observed_value": None, "baseline_value": None}
    return rec | over


def test_a_state_dated_ahead_or_of_no_detector_is_refused() -> None:
    assert refused(state(), NOW) is None
    assert refused(state(changed_at=NOW + MAX_AHEAD_MS), NOW) is None  # within the skew
    assert refused(state(changed_at=NOW + MAX_AHEAD_MS + 1), NOW) == "dated_ahead"
    assert refused(state(changed_at=2**62), NOW) == "dated_ahead"
    assert refused(state(detector="value_rate2"), NOW) == "unknown_detector"


def test_a_trip_is_dated_after_the_change_before_it() -> None:
    """A person's close from a host whose clock runs ahead (within the skew allowed) must
    not make the gate's next trip, dated by its own clock, lose to it."""
    book = HaltBook()
    book.apply(StateChange(SCOPE, "value_rate", HaltState.CLOSED, NOW + 60_000))
    trip = Trip("endpoint", "ep_1", Detector.VALUE_RATE, 1, 1.0, NOW)
    book.trip_now(trip, NOW)
    assert book.halts == {SCOPE: HaltState.TRIPPED}
    latest = book.latest(SCOPE, "value_rate")
    assert latest is not None and latest.changed_at == NOW + 60_001
    # published and stored with that date (as the runner does): every gate, and
    # PostgreSQL, take it as later than the close; with now, they dropped it
    from postbacks.settings import load_settings
    from streams.anomaly_gate.control import TripWriter

    _key, rec = TripWriter(load_settings(), book).trip(trip, book.tripped_at(trip, NOW))
    assert rec["changed_at"] == NOW + 60_001
    other = HaltBook()
    other.apply(StateChange(SCOPE, "value_rate", HaltState.CLOSED, NOW + 60_000))
    assert other.apply(StateChange(SCOPE, "value_rate", HaltState.TRIPPED, rec["changed_at"]))
    assert other.halts == {SCOPE: HaltState.TRIPPED}


def test_refusals_read_at_start_count_once_and_only_if_still_current() -> None:
    """The gate and the agent both read the compacted topic from its beginning at every
    start: a refusal a later change of its key replaced was counted when first read."""
    from postbacks.core.anomaly.halts import StartRefusals

    r: StartRefusals[str] = StartRefusals()
    assert r.refused("a", "dated_ahead") == ["dated_ahead"]  # live: at once
    r.begin()
    assert r.refused("a", "dated_ahead") == []
    assert r.refused("b", "unknown_detector") == []
    r.replaced("a")  # a later change of "a": fixed
    assert r.refused("c", "dated_ahead") == []
    r.replaced("c")
    assert r.refused("c", "unknown_detector") == []  # refused again, for another reason
    assert sorted(r.end()) == ["unknown_detector", "unknown_detector"]  # b, and c's last
    assert r.end() == []  # once
    r.replaced("b")  # live again: nothing pending
    assert r.refused("b", "dated_ahead") == ["dated_ahead"]
