"""A strict delivery whose partition is revoked while its request is out: when the answer
comes, its outputs are dropped (the partition's new owner redoes it), and so is what it
would have changed in the endpoint's order. This agent used to record and publish that
order state (ordering.v1) at its next commit, over the new owner's: a head that was
already delivered, or none while a real head waited."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.core.classify import HttpResult
from postbacks.transport.http import SendResult
from tests.unit.test_lanes_halts import _endpoint, _setup, _submit


class Gate:
    """A receiver that answers 503 once let go."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.sent = 0

    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        self.sent += 1
        await self.go.wait()
        return SendResult(HttpResult(503, None, None), 1.0, b"down", None, b"down")


def _run(revoke: bool) -> tuple[list[Any], bool]:
    lanes, _halts, _transport, tracker = _setup(_endpoint("ep_s", ordering="strict"))
    gate = Gate()
    lanes.deliverer.transport = gate  # type: ignore[assignment]

    async def main() -> tuple[list[Any], bool]:
        _submit(lanes, tracker, 0, endpoint_id="ep_s")
        for _ in range(10):
            await asyncio.sleep(0)
        assert gate.sent == 1  # out
        assert lanes.strict is not None
        lanes.strict.take_writes()  # what was already due to be published
        if revoke:
            tracker.forget("dispatch.v1", 0)
            lanes.drop_partitions({("dispatch.v1", 0)})
        gate.go.set()
        for _ in range(30):
            await asyncio.sleep(0)
        st = lanes.strict.states["ep_s"]
        return lanes.strict.take_writes(), st.here

    return asyncio.run(main())


def test_a_revoked_strict_delivery_leaves_the_order_to_the_new_owner() -> None:
    writes, here = _run(revoke=True)
    assert writes == []  # nothing published over the owner's state
    assert not here  # and this agent's state is idle: the next assignment adopts the owner's


def test_kept_it_blocks_the_endpoint_and_is_published() -> None:
    writes, _here = _run(revoke=False)
    assert [k for _t, k, _v in writes] == [b"ep_s"]  # the retried head blocks its endpoint
