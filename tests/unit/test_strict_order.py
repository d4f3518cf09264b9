"""Strict ordering's decisions (streams/strict.py) on fake lanes: who is sent, who is
parked behind the head (in its delay topic, in order), who waits in memory; and the
offset tracker's outputs in finishing order."""

from __future__ import annotations

from typing import Any

import pytest

from postbacks.codec import codec_for
from postbacks.core.retry import RetryPolicy
from streams.delivery import Deliverer
from streams.lane import Lane, Work
from streams.offsets import Item, Tracker
from streams.strict import MARK, OrderState, StrictOrder
from tests.unit.factories import FakeMessage, make_delivery

EP = "ep_strict"
RETRY = "retry.5s.v1"
DLV = codec_for("Delivery")


class Rig:
    def __init__(self) -> None:
        self.tracker = Tracker()
        self.offset = 0
        self.now = 1_000_000
        deliverer = Deliverer(None, RetryPolicy())  # type: ignore[arg-type]  # never sends
        self.strict = StrictOrder(deliverer, lambda: self.now, grace_ms=60_000)
        self.lane = Lane(EP)

    def arrive(self, did: str, **over: Any) -> Work:
        self.offset += 1
        d = make_delivery(delivery_id=did, endpoint_id=EP, **over)
        msg = FakeMessage(DLV.encode(d), offset=self.offset, key=EP.encode())
        work = Work(msg, d, self.tracker.track("dispatch.v1", 0, self.offset))  # type: ignore[arg-type]
        self.strict.submit(self.lane, work)
        return work

    def send_next(self, forward_to: str | None = None, due: int = 0) -> Work:
        """The lane's next delivery is sent; it is resolved, or forwarded to a delay topic."""
        work = self.lane.queue.popleft()
        out: list[Item] = []
        if forward_to is not None:
            rec = {**work.delivery, "due_at": due, "trigger": "retry"}
            out.append((forward_to, EP.encode(), DLV.encode(rec)))
        work.slot.finish(out)
        self.strict.after(self.lane, work, out)
        return work

    def queued(self) -> list[str]:
        return [w.delivery["delivery_id"] for w in self.lane.queue]

    def waiting(self) -> list[str]:
        return [w.delivery["delivery_id"] for w in self.strict.states[EP].waiting]

    def parked(self) -> list[tuple[str, str, int]]:
        """(topic, delivery id, due_at) of every parked or forwarded record, in output order."""
        items, _ = self.tracker.drain()
        out = []
        for topic, _key, value in items:
            if topic.startswith(("retry.", "quarantine.")):
                d = DLV.decode(value)
                out.append((topic, d["delivery_id"], d["due_at"]))  # type: ignore[index]
        return out


def returned(rig: Rig, did: str, *, marked: bool) -> Work:
    return rig.arrive(did, last_error=f"{MARK} behind x" if marked else "503")


def test_unblocked_deliveries_queue_in_order() -> None:
    rig = Rig()
    for did in ("d1", "d2", "d3"):
        rig.arrive(did)
    assert rig.queued() == ["d1", "d2", "d3"]


def test_a_retried_delivery_becomes_the_head_and_later_ones_park_behind_it() -> None:
    rig = Rig()
    for did in ("d1", "d2", "d3"):
        rig.arrive(did)
    rig.send_next(forward_to=RETRY, due=2_000_000)  # d1 fails: retry in the 5-s tier
    rig.arrive("d4")  # arrives while d1 waits
    st = rig.strict.states[EP]
    assert (st.head, st.topic, st.due_at, st.tail) == ("d1", RETRY, 2_000_000, "d4")
    assert rig.queued() == []
    # in the topic: the head first, then its followers in order, all due with the head
    assert rig.parked() == [(RETRY, "d1", 2_000_000), (RETRY, "d2", 2_000_000),
                            (RETRY, "d3", 2_000_000), (RETRY, "d4", 2_000_000)]


def test_the_head_returns_first_and_its_followers_wait_for_its_answer() -> None:
    rig = Rig()
    rig.arrive("d1")
    rig.arrive("d2")
    rig.send_next(forward_to=RETRY, due=2_000_000)
    rig.parked()
    rig.arrive("d1", trigger="retry")  # the head is back
    returned(rig, "d2", marked=True)  # its follower, right behind it
    rig.arrive("d3")  # new: must not overtake d2
    assert rig.queued() == ["d1", "d2"] and rig.waiting() == ["d3"]
    rig.send_next()  # d1 delivered
    st = rig.strict.states[EP]
    assert st.head is None and st.tail is None and st.drain is None
    assert rig.queued() == ["d2", "d3"]  # d2 was the last one out: d3 may go now


def test_a_head_failing_again_moves_its_followers_to_its_new_topic_first() -> None:
    rig = Rig()
    rig.arrive("d1")
    rig.arrive("d2")
    rig.arrive("d3")
    rig.send_next(forward_to=RETRY, due=2_000_000)
    rig.parked()
    rig.arrive("d1", trigger="retry")
    returned(rig, "d2", marked=True)  # d3 is still on its way back
    rig.send_next(forward_to="retry.30s.v1", due=3_000_000)  # d1 fails again
    rig.arrive("d9")  # new, while d3 is still out: held in memory
    assert rig.waiting() == ["d9"]
    returned(rig, "d3", marked=True)  # the last of them: d9 may be parked now
    assert rig.waiting() == []
    assert [p[1] for p in rig.parked()] == ["d1", "d2", "d3", "d9"]
    st = rig.strict.states[EP]
    assert (st.head, st.topic, st.tail, st.drain) == ("d1", "retry.30s.v1", "d9", None)


def test_a_head_delivered_while_followers_are_out_holds_new_ones_until_they_are_back() -> None:
    rig = Rig()
    rig.arrive("d1")
    rig.arrive("d2")
    rig.send_next(forward_to=RETRY, due=2_000_000)
    rig.arrive("d1", trigger="retry")
    rig.send_next()  # delivered before d2 came back
    rig.arrive("d5")
    assert rig.waiting() == ["d5"] and rig.queued() == []
    returned(rig, "d2", marked=True)
    assert rig.queued() == ["d2", "d5"]


def test_a_lost_head_stops_blocking_after_its_grace() -> None:
    rig = Rig()
    rig.arrive("d1")
    rig.send_next(forward_to=RETRY, due=2_000_000)
    rig.now = 2_000_000 + 60_001
    rig.strict.tick(rig.lane)
    rig.arrive("d2")
    assert rig.queued() == ["d2"]


@pytest.mark.parametrize("raw", [
    b'{"due_at": 1e400}', b'{"drain_due": -1}', b'{"enqueued": 1.5}', b'{"due_at": "5"}',
    b'{"due_at": true}', b'{"head": 5}', b'{"tail": ["d1"]}', b'{"topic": {}}',
    b"[" * 100_000 + b"]" * 100_000, b"[]",
])
def test_a_record_that_is_not_a_state_is_refused_with_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):  # (what load_states passes over with a warning)
        OrderState.load(raw)


def test_state_round_trips_and_a_busy_endpoint_keeps_its_own() -> None:
    st = OrderState("d1", RETRY, 5, "d3", "d2", 4)
    again = OrderState.load(st.dump())
    assert (again.head, again.topic, again.due_at, again.tail, again.drain,
            again.drain_due) == ("d1", RETRY, 5, "d3", "d2", 4)
    rig = Rig()
    rig.arrive("d1")
    rig.send_next(forward_to=RETRY, due=2_000_000)
    rig.arrive("d1", trigger="retry")  # here: not idle
    rig.strict.adopt({EP: OrderState(), "ep_other": OrderState("x", RETRY, 1)})
    assert rig.strict.states[EP].head == "d1"
    assert rig.strict.states["ep_other"].head == "x"
    writes = rig.strict.take_writes()
    assert [(t, k) for t, k, _ in writes] == [("ordering.v1", EP.encode())]
    assert rig.strict.take_writes() == []


def test_tracker_hands_outputs_over_in_finishing_order() -> None:
    t = Tracker()
    a, b = t.track("p", 0, 1), t.track("p", 0, 2)
    b.finish([("x", None, b"second-offset")])
    a.finish([("x", None, b"first-offset")])
    items, commits = t.drain()
    assert [v for _, _, v in items] == [b"second-offset", b"first-offset"]
    assert commits[("p", 0)][0] == 3


def test_a_follower_that_cannot_be_parked_is_dead_lettered_and_the_rest_go_on(
        monkeypatch: Any) -> None:
    rig = Rig()
    rig.arrive("d1")
    rig.send_next(forward_to=RETRY, due=2_000_000)  # d1 waits in a tier: the head
    outcome = rig.strict.deliverer.outcome

    def odd(out: Any, d: Any, *args: Any) -> None:
        if d["delivery_id"] == "d3":
            raise ValueError("a bug while parking")
        outcome(out, d, *args)

    monkeypatch.setattr(rig.strict.deliverer, "outcome", odd)
    for did in ("d2", "d3", "d4"):
        rig.arrive(did)
    items, commits = rig.tracker.drain()
    assert commits[("dispatch.v1", 0)][0] == 5  # every slot finished: nothing stalls
    dead = [codec_for("DeadLetter").decode(v) for t, _k, v in items if t == "dlq.v1"]
    assert [(d["delivery_id"], d["reason"]) for d in dead] == [("d3", "internal_error")]
    parked = [DLV.decode(v)["delivery_id"] for t, _k, v in items if t == RETRY]
    assert parked == ["d1", "d2", "d4"]
    assert rig.strict.states[EP].tail == "d4"
