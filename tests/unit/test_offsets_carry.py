"""The agent's first commit after an assignment keeps, in its metadata, the offsets the
previous owner finished that it has not read again yet. The tracker knows only what it
has read: that commit used to drop the rest, and the owner after the next rebalance sent
them all again (a second request and a second ``delivered`` outcome each)."""

from __future__ import annotations

from streams.offsets import Tracker, decode_done, encode_done

KEY = ("dispatch.v1", 0)


def _first_commit(carry: bool) -> set[int]:
    # the previous owner committed 100, with 102..1100 finished above it
    unread = {KEY: decode_done(100, encode_done(100, list(range(102, 1101))))}
    tracker = Tracker()
    for offset in range(100, 600):  # this owner has read 100..599 so far
        slot = tracker.track(*KEY, offset)
        if offset in unread[KEY]:
            unread[KEY].discard(offset)  # as the agent's loop does: finished before
            slot.finish([])
        elif offset == 101:
            slot.finish([])  # sent by this owner; 100 is still in flight
    _items, commits = tracker.drain(unread if carry else None)
    base, metadata = commits[KEY]
    assert base == 100
    return decode_done(base, metadata)


def test_offsets_finished_before_and_not_yet_read_again_stay_finished() -> None:
    assert _first_commit(carry=True) == set(range(101, 1101))


def test_nothing_unread_changes_nothing() -> None:
    tracker = Tracker()
    tracker.track(*KEY, 10)
    tracker.track(*KEY, 12).finish([])
    assert tracker.drain({KEY: set()})[1] == {KEY: (10, encode_done(10, [12]))}
