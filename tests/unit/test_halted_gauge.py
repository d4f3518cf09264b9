"""``postbacks_anomaly_halted_scopes`` (alert PostbacksScopeHalted, the dashboard's "Halted
scopes") counts the scopes tripped in a gate's book. It used to be set only when a control
record changed that book, and a gate's own trip is in its book before its record comes
back: the gate that tripped a scope kept exporting 0, so with one gate the alert never
fired while every delivery of the scope was held."""

from __future__ import annotations

import time

from postbacks.codec import codec_for
from postbacks.core.anomaly import Detector, Trip
from postbacks.metrics import HALTED_SCOPES
from postbacks.settings import load_settings
from streams.anomaly_gate.config import HaltBook
from streams.anomaly_gate.control import ControlReader, TripWriter

NOW = int(time.time() * 1000)


def halted(kind: str) -> float:
    return HALTED_SCOPES.labels(kind)._value.get()  # type: ignore[attr-defined]


def test_a_gates_own_trip_is_counted_and_stays_counted_when_read_back() -> None:
    settings = load_settings()
    book = HaltBook()
    for kind in ("endpoint", "global"):
        HALTED_SCOPES.labels(kind).set(0)
    trip = Trip("endpoint", "ep_gauge", Detector.VALUE_RATE, 5_000_000, 1_000_000.0, NOW)
    book.trip_now(trip, NOW)  # as the engine does on a hold that trips
    writer = TripWriter(settings, book)
    _key, rec = writer.trip(trip, book.tripped_at(trip, NOW))
    assert halted("endpoint") == 1
    assert halted("global") == 0
    # the gate reads its own record back from the control topic: nothing changes in the
    # book, and the gauge still says 1
    reader = ControlReader(settings, book, writer)
    reader._apply(codec_for("BreakerState").encode(rec))  # type: ignore[arg-type]
    assert halted("endpoint") == 1
    # a person closes it: 0
    closed = dict(rec, state="closed", changed_at=rec["changed_at"] + 1, actor="alice")
    reader._apply(codec_for("BreakerState").encode(closed))  # type: ignore[arg-type]
    assert halted("endpoint") == 0


def test_a_refused_change_read_live_is_counted_at_once() -> None:
    """Past the start's catch-up, every refused change counts as it is read."""
    from postbacks.metrics import CONTROL_REFUSED

    settings = load_settings()
    book = HaltBook()
    reader = ControlReader(settings, book, TripWriter(settings, book))
    rec = {"scope": "endpoint", "scope_key": "ep_ahead", "detector": "value_rate",
           "state": "closed", "changed_at": NOW + 3_600_000, "actor": "mallory",
           "reason": None, "observed": None, "baseline": None}
    count = CONTROL_REFUSED.labels("dated_ahead")._value  # type: ignore[attr-defined]
    before = count.get()
    reader._apply(codec_for("BreakerState").encode(rec), b"endpoint/ep_ahead/value_rate")  # type: ignore[arg-type]
    assert count.get() == before + 1


def test_an_agent_counts_at_start_only_the_refusals_still_current() -> None:
    """Agents read the control topic from its beginning too: a refused change a later one
    of its key replaced is not counted again at every agent start (PostbacksControlRefused
    fired after each); one still current is counted once; live ones at once."""
    from postbacks.metrics import CONTROL_REFUSED
    from streams.halts import AgentHalts

    count = CONTROL_REFUSED.labels("dated_ahead")._value  # type: ignore[attr-defined]
    base = {"scope": "endpoint", "detector": "value_rate", "actor": "mallory", "reason": None,
            "observed": None, "baseline": None}
    forged = dict(base, scope_key="ep_a", state="closed", changed_at=NOW + 3_600_000)
    fixed = dict(base, scope_key="ep_a", state="tripped", changed_at=NOW, actor=None)
    current = dict(base, scope_key="ep_b", state="closed", changed_at=NOW + 3_600_000)

    before = count.get()
    halts = AgentHalts("*", clock=lambda: NOW / 1000)
    halts.catching_up()
    halts.apply([forged, fixed, current])  # type: ignore[list-item]
    assert count.get() == before
    halts.caught_up()
    assert count.get() == before + 1  # ep_b's, still current
    assert ("endpoint", "ep_a") in halts.book.halts  # the trip after the forged close holds
    halts.apply([current])  # type: ignore[list-item]  # read live
    assert count.get() == before + 2
