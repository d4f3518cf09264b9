"""An endpoint whose ``ordering`` changes from ``strict`` while its head is out. The
head's answer used to leave the order state alone (the endpoint was no longer strict),
so the head counted as in flight for good: the deliveries held back behind it were never
released, and the partition's offsets stayed behind the first of them until a restart."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from streams.strict import OrderState
from tests.unit.test_lanes_halts import _endpoint, _submit
from tests.unit.test_strict_revoked import _rig, _turns

RETRY = "retry.5s.v1"


def test_a_head_answered_after_strict_was_switched_off_releases_what_waited() -> None:
    lanes, tracker, gate = _rig()
    view: dict[str, Any] = lanes.endpoint.__self__  # the agent's endpoint view

    async def main() -> tuple[list[str], Any, list[Any]]:
        lanes.strict.adopt({"ep_s": OrderState("dlv_0", RETRY, 1, None, None, 0, 0)})
        _submit(lanes, tracker, 0, endpoint_id="ep_s", trigger="retry")  # the head, back
        await _turns(10)
        assert gate.sent == 1  # out, waiting for its answer
        _submit(lanes, tracker, 1, endpoint_id="ep_s")  # held back behind it
        await _turns(10)
        assert [w.delivery["delivery_id"] for w in lanes.strict.states["ep_s"].waiting] == [
            "dlv_1"]
        view["ep_s"] = _endpoint("ep_s")  # ordering: none (the view refreshed)
        lanes.strict.take_writes()
        gate.go.set()  # the head's answer (503: to a retry tier)
        await _turns()
        items, commits = tracker.drain()
        return [t for t, _k, _v in items], commits, lanes.strict.take_writes()

    topics, commits, writes = asyncio.run(main())
    assert gate.sent == 2  # the one held back was sent
    assert commits == {("dispatch.v1", 0): (2, "")}  # both finished: the offsets move on
    assert topics.count("attempts.v1") == 2, topics
    # the cleared state is published, so no agent adopts the stale head again
    assert [(t, k) for t, k, _v in writes] == [("ordering.v1", b"ep_s")]
    assert OrderState.load(writes[0][2]).head is None


def test_it_does_not_wait_for_the_endpoints_other_requests_to_end() -> None:
    """Switched off strict, the endpoint sends several at once (concurrency 4): under
    steady traffic one of them was always out, and what waited behind the head was never
    released (only the head's own answer is waited for)."""
    lanes, tracker, gate = _rig()
    view: dict[str, Any] = lanes.endpoint.__self__

    async def main() -> int:
        lanes.strict.adopt({"ep_s": OrderState("dlv_0", RETRY, 1, None, None, 0, 0)})
        _submit(lanes, tracker, 0, endpoint_id="ep_s", trigger="retry")  # the head, back
        await _turns(10)
        _submit(lanes, tracker, 1, endpoint_id="ep_s")  # held back behind it
        view["ep_s"] = dataclasses.replace(_endpoint("ep_s"), concurrency=4)
        _submit(lanes, tracker, 2, endpoint_id="ep_s")  # not strict now: sent at once
        await _turns(10)
        assert gate.sent == 2
        gate.first.set()  # the head's answer only; dlv_2 is still out
        await _turns()
        sent = gate.sent
        gate.go.set()
        await _turns()
        return sent

    assert asyncio.run(main()) == 3  # dlv_1 went out while dlv_2 was still in flight
