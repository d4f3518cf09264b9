"""Strict followers parked in a retry tier ripen, and hop, with their head. A tier's record
ripens one period after it was enqueued (or when due): a follower parked with its own
enqueue time ripened after the head had hopped, and a follower parked in between landed
before it (H, F2, F1 with a jittered delay and steady traffic). Followers now carry the
head's enqueue time. The relay's rule is modelled, one partition per delay topic, with the
functions it uses (``ripe_at``, ``is_due``, ``divert_topic``)."""

from __future__ import annotations

from collections import deque

from postbacks.core.delay import is_due, ripe_at
from postbacks.core.quarantine import QUARANTINE_AHEAD_MS, divert_topic
from tests.unit.test_strict_order import DLV, EP, RETRY, Rig
from topics import RETRY_TIERS, TOPICS

T0 = 1_000_000
PERIOD_MS = 5_000  # retry.5s.v1


# each delay topic's period: a retry tier's, and the most a quarantine wait can be
PERIODS = {**{TOPICS.retry_tier(name).base: seconds * 1000 for name, seconds in RETRY_TIERS},
           TOPICS.quarantine.base: QUARANTINE_AHEAD_MS + 60_000}


def _relay(appends: list[tuple[int, str, int, int]], until_ms: int,
           period_ms: int = PERIOD_MS) -> list[str]:
    """Released ids, in order. ``appends``: (time, id, due_at, enqueued_at) the agent
    writes to the tier of ``period_ms``; a ripe record not yet due hops to the delay topic
    of its remaining wait, enqueued when it ripened (each topic: one partition)."""
    start = next(base for base, p in PERIODS.items() if p == period_ms)
    topics: dict[str, deque[tuple[str, int, int]]] = {base: deque() for base in PERIODS}
    pending = deque(sorted(appends))
    released: list[str] = []
    for now in range(T0, until_ms, 100):
        while pending and pending[0][0] <= now:
            _t, did, due, enq = pending.popleft()
            topics[start].append((did, due, enq))
        for base, partition in topics.items():
            while partition:
                did, due, enq = partition[0]
                ripe = ripe_at(due, enq, PERIODS[base], now)
                if ripe is not None and ripe > now:
                    break
                partition.popleft()
                if is_due(due, now):
                    released.append(did)
                else:
                    # (the relay's rule: from when it ripened, if read within a minute)
                    at = ripe if ripe is not None and 0 <= now - ripe <= 60_000 else now
                    topics[divert_topic(due, at)].append((did, due, at))
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
    released = _relay(appends, T0 + 20_000)
    assert sorted(released) == ["F1", "F2", "H"] and released != ["H", "F1", "F2"], released


def rig_state_enqueued() -> int:
    rig = Rig()
    rig.now = T0
    rig.arrive("H", enqueued_at=T0)
    rig.send_next(forward_to=RETRY, due=T0 + 7_000)
    st = rig.strict.states[EP]
    from streams.strict import OrderState

    assert OrderState.load(st.dump()).enqueued == T0  # kept in ordering.v1
    return st.enqueued


def test_a_strict_head_diverted_to_a_tier_keeps_its_followers_behind_it() -> None:
    """Behind an open breaker (reopening in 5 minutes) a strict endpoint's head waits in
    retry.2m.v1 (a divert due over a minute ahead: core/quarantine.py), and deliveries that
    arrive meanwhile are parked behind it there. They carry the head's enqueue time, so
    the relay returns them after it and in order (with their own, F2, H, F1)."""
    import asyncio
    from typing import Any

    from postbacks.codec import codec_for
    from postbacks.core.breaker import BreakerPolicy, BreakerState
    from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
    from postbacks.core.retry import RetryPolicy
    from streams.delivery import Deliverer
    from streams.lanes import Lanes
    from streams.offsets import Tracker
    from tests.unit.factories import FakeMessage, make_delivery

    dlv = codec_for("Delivery")
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),),
                  config=EndpointConfig(ordering="strict"))
    clock = [T0 / 1000]
    deliverer = Deliverer(None, RetryPolicy(5, 3600, 86_400, 0.2, 50, {}),  # type: ignore[arg-type]
                          clock=lambda: clock[0])
    lanes = Lanes(deliverer, {ep.endpoint_id: ep}.get, BreakerPolicy(), 30, 1000, 30,
                  clock=lambda: clock[0], view_checked_ms=lambda: int(clock[0] * 1000))
    tracker = Tracker()
    appends: list[tuple[int, str, int, int]] = []

    async def main() -> None:
        lanes.adopt("ep_1", BreakerState(state="open", opened_at_ms=T0, changed_ms=T0))
        for offset, (at_s, did) in enumerate(((0, "H"), (30, "F1"), (70, "F2"))):
            clock[0] = T0 / 1000 + at_s
            d: Any = make_delivery(delivery_id=did, endpoint_id="ep_1",
                                   created_at=int(clock[0] * 1000))
            lanes.submit(FakeMessage(dlv.encode(d), offset=offset),  # type: ignore[arg-type]
                         tracker.track("dispatch.v1", 0, offset))
            for _ in range(20):
                await asyncio.sleep(0)
            for topic, _k, value in tracker.drain()[0]:
                if topic.startswith(("retry.", "quarantine.")):
                    assert topic == "retry.2m.v1", topic
                    r = dlv.decode(value)
                    appends.append((int(clock[0] * 1000), r["delivery_id"], r["due_at"],
                                    r["enqueued_at"]))

    asyncio.run(main())
    assert [(did, enq) for _t, did, _due, enq in appends] == [("H", T0), ("F1", T0),
                                                             ("F2", T0)]
    assert _relay(appends, T0 + 400_000, period_ms=120_000) == ["H", "F1", "F2"]
    own = [(t, did, due, t) for t, did, due, _enq in appends]  # what the fix removed
    released = _relay(own, T0 + 400_000, period_ms=120_000)
    assert sorted(released) == ["F1", "F2", "H"] and released != ["H", "F1", "F2"], released
