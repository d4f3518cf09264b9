"""Strict ordering across a revoke. The order state an agent changed for records whose
outputs a revoke dropped is not published (this agent used to publish it at its next
commit, over the new owner's: a head that was already delivered, or a follower parked
that was never written, which then waited for itself for ten minutes). A head answered
after its partition was revoked changes nothing; a copy of it read again (the partition
came back) stays the head."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.core.classify import HttpResult
from postbacks.transport.http import SendResult
from streams.strict import OrderState
from tests.unit.test_lanes_halts import _endpoint, _setup, _submit

P0 = ("dispatch.v1", 0)


class Gate:
    """A receiver that answers 503 once let go: ``go`` lets every request go, ``first``
    only the first one."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.first = asyncio.Event()
        self.sent = 0

    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        self.sent += 1
        if self.sent == 1:
            await asyncio.wait([asyncio.ensure_future(self.go.wait()),
                                asyncio.ensure_future(self.first.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
        else:
            await self.go.wait()
        return SendResult(HttpResult(503, None, None), 1.0, b"down", None, b"down")


async def _turns(n: int = 30) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _rig() -> tuple[Any, Any, Gate]:
    lanes, _halts, _transport, tracker = _setup(_endpoint("ep_s", ordering="strict"))
    gate = Gate()
    lanes.deliverer.transport = gate
    return lanes, tracker, gate


def _revoke(lanes: Any, tracker: Any) -> None:
    tracker.forget(*P0)
    lanes.drop_partitions({P0})


def test_a_head_answered_after_the_revoke_leaves_the_order_to_the_new_owner() -> None:
    lanes, tracker, gate = _rig()

    async def main() -> tuple[list[Any], bool]:
        _submit(lanes, tracker, 0, endpoint_id="ep_s")
        await _turns(10)
        assert gate.sent == 1
        lanes.strict.take_writes()
        _revoke(lanes, tracker)
        gate.go.set()
        await _turns()
        return lanes.strict.take_writes(), "ep_s" in lanes.strict.states

    writes, kept = asyncio.run(main())
    assert writes == []  # nothing published over the owner's state
    assert not kept  # the next assignment adopts the committed state


def test_a_state_changed_before_the_revoke_is_not_published() -> None:
    lanes, tracker, gate = _rig()

    async def main() -> tuple[list[Any], bool]:
        gate.go.set()
        _submit(lanes, tracker, 0, endpoint_id="ep_s")  # answered 503: the head, blocked
        await _turns()
        _submit(lanes, tracker, 1, endpoint_id="ep_s")  # parked behind it
        assert lanes.strict.states["ep_s"].tail == "dlv_1"
        _revoke(lanes, tracker)  # the parked record and the retry were never written
        return lanes.strict.take_writes(), "ep_s" in lanes.strict.states

    writes, kept = asyncio.run(main())
    assert writes == [] and not kept


def test_the_partition_back_with_the_head_read_again_keeps_it_the_head() -> None:
    lanes, tracker, gate = _rig()

    async def main() -> OrderState:
        _submit(lanes, tracker, 0, endpoint_id="ep_s")
        await _turns(10)
        _revoke(lanes, tracker)
        # assigned back at once (the committed state: the head is dlv_0), read again
        lanes.strict.adopt({"ep_s": OrderState("dlv_0", "retry.5s.v1", 1)})
        _submit(lanes, tracker, 0, endpoint_id="ep_s")
        gate.first.set()  # the first copy's answer: dropped; the copy read again goes out
        await _turns()
        assert gate.sent == 2
        return lanes.strict.states["ep_s"]

    st = asyncio.run(main())
    assert st.head == "dlv_0" and st.here  # its copy read again is the one that counts


def test_kept_it_blocks_the_endpoint_and_is_published() -> None:
    lanes, tracker, gate = _rig()

    async def main() -> list[Any]:
        _submit(lanes, tracker, 0, endpoint_id="ep_s")
        await _turns(10)
        lanes.strict.take_writes()
        gate.go.set()
        await _turns()
        return lanes.strict.take_writes()

    writes = asyncio.run(main())
    assert [k for _t, k, _v in writes] == [b"ep_s"]  # the retried head blocks its endpoint


def test_an_endpoint_this_agent_does_not_read_is_not_ticked_or_published() -> None:
    """Every agent loads every endpoint's order state; one whose breaker it follows gets a
    lane and is woken every second. Its state, long overdue by this agent's copy, was
    cleared and published over its owner's."""
    lanes, _tracker, _gate = _rig()
    lanes.strict.adopt({"ep_b": OrderState("dlv_h1", "retry.5s.v1", 1)})
    lanes._lane("ep_b")  # as a breaker transition followed from breakers.v1 makes it
    lanes.wake()  # far past its due time and grace
    assert lanes.strict.take_writes() == []
    assert lanes.strict.states["ep_b"].head == "dlv_h1"


def test_a_revoked_head_in_flight_is_not_ticked_and_goes_when_answered() -> None:
    lanes, tracker, gate = _rig()

    async def main() -> tuple[list[Any], list[Any], bool]:
        lanes.strict.adopt({"ep_s": OrderState("dlv_0", "retry.5s.v1", 1, tail="dlv_9",
                                               drain="dlv_8", drain_due=1)})
        _submit(lanes, tracker, 0, endpoint_id="ep_s")  # the head, back: here, sent
        await _turns(10)
        assert gate.sent == 1 and lanes.strict.states["ep_s"].here
        lanes.strict.take_writes()
        _revoke(lanes, tracker)
        assert lanes.strict.states["ep_s"].revoked
        lanes.wake()  # its follower long overdue: not this agent's to give up on now
        ticked = lanes.strict.take_writes()
        gate.go.set()
        await _turns()
        return ticked, lanes.strict.take_writes(), "ep_s" in lanes.strict.states

    ticked, answered, kept = asyncio.run(main())
    assert ticked == [] and answered == [] and not kept
