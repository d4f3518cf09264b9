"""Strict followers parked in a retry tier ripen, and hop, with their head. A tier's record
ripens one period after it was enqueued (or when due): a follower parked with its own
enqueue time ripened after the head had hopped, and a follower parked in between landed
before it (H, F2, F1 with a jittered delay and steady traffic). Followers now carry the
head's enqueue time. The relay's rule is modelled on one partition with the functions it
uses (``ripe_at``, ``is_due``)."""

from __future__ import annotations

from collections import deque

from postbacks.core.delay import is_due, ripe_at
from tests.unit.test_strict_order import DLV, EP, RETRY, Rig

T0 = 1_000_000
PERIOD_MS = 5_000  # retry.5s.v1


def _relay(appends: list[tuple[int, str, int, int]], until_ms: int) -> list[str]:
    """Released ids, in order. ``appends``: (time, id, due_at, enqueued_at) the agent
    writes; a ripe record not yet due goes back to the tail, enqueued now (a hop)."""
    partition: deque[tuple[str, int, int]] = deque()
    pending = deque(sorted(appends))
    released: list[str] = []
    for now in range(T0, until_ms, 100):
        while pending and pending[0][0] <= now:
            _t, did, due, enq = pending.popleft()
            partition.append((did, due, enq))
        while partition:
            did, due, enq = partition[0]
            ripe = ripe_at(due, enq, PERIOD_MS)
            if ripe is not None and ripe > now:
                break
            partition.popleft()
            if is_due(due, now):
                released.append(did)
            else:
                partition.append((did, due, now))
    return released


def _parked_by_strict() -> list[tuple[int, str, int, int]]:
    """H fails at T0 (retry due in 7 s, a jittered 5-s delay); F1 comes at +1 s, F2 at
    +5.5 s, after H has hopped. What the agent writes to the tier, and when."""
    rig = Rig()
    rig.now = T0
    rig.arrive("H", enqueued_at=T0)
    rig.send_next(forward_to=RETRY, due=T0 + 7_000)
    rig.tracker.drain()  # H's own retry record: appended at T0 below
    out = []
    for at, did in ((T0 + 1_000, "F1"), (T0 + 5_500, "F2")):
        rig.now = at
        rig.arrive(did)
        for topic, _k, value in rig.tracker.drain()[0]:
            if topic == RETRY:
                d = DLV.decode(value)
                out.append((at, d["delivery_id"], d["due_at"], d["enqueued_at"]))
    return [(T0, "H", T0 + 7_000, T0), *out]


def test_followers_carry_the_heads_enqueue_time_and_come_back_in_order() -> None:
    appends = _parked_by_strict()
    assert [(did, enq) for _t, did, _due, enq in appends] == [("H", T0), ("F1", T0),
                                                             ("F2", T0)]
    assert rig_state_enqueued() == T0
    assert _relay(appends, T0 + 20_000) == ["H", "F1", "F2"]


def test_with_their_own_enqueue_time_the_relay_reordered_them() -> None:
    """The model reproduces the reordering the fix removes."""
    appends = [(t, did, due, t) for t, did, due, _enq in _parked_by_strict()]
    assert _relay(appends, T0 + 20_000) == ["H", "F2", "F1"]


def rig_state_enqueued() -> int:
    rig = Rig()
    rig.now = T0
    rig.arrive("H", enqueued_at=T0)
    rig.send_next(forward_to=RETRY, due=T0 + 7_000)
    st = rig.strict.states[EP]
    from streams.strict import OrderState

    assert OrderState.load(st.dump()).enqueued == T0  # kept in ordering.v1
    return st.enqueued
