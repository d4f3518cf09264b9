"""Held table writes come out in the order their states were taken, up to a ticket: an
older state is never produced after a newer one for the same key, whichever of two
overlapping flushes is acknowledged first."""

from __future__ import annotations

from streams.anomaly_gate.state_writes import HeldWrites, Write


def _w(key: str, value: int) -> Write:
    return Write(table=None, partition=0, key=key, value=value)


def test_release_up_to_a_ticket_in_the_order_taken() -> None:
    h = HeldWrites()
    a = h.hold([_w("x", 1), _w("y", 1)])
    b = h.hold([_w("x", 2)])
    assert a < b and len(h) == 3
    assert h.release(a) == [_w("x", 1), _w("y", 1)]
    assert h.release(a) == []
    assert h.release(b) == [_w("x", 2)]
    assert len(h) == 0


def test_a_later_flush_acknowledged_first_releases_the_older_state_before_its_own() -> None:
    h = HeldWrites()
    a = h.hold([_w("x", 1)])
    b = h.hold([_w("x", 2)])
    assert [w.value for w in h.release(b)] == [1, 2]  # x ends at 2 on the changelog
    assert h.release(a) == []  # the older flush finds its writes already out


def test_release_all_and_an_empty_state() -> None:
    h = HeldWrites()
    t = h.hold([])
    assert h.release(t) == []
    h.hold([_w("z", 3)])
    assert h.release(None) == [_w("z", 3)]
