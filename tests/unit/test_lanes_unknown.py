"""Deliveries for an endpoint the agent's view does not have (deleted, or an id another
producer made up) are dead-lettered as ``unknown_endpoint``; the lane made for each such
id was kept for good, so a stream of made-up ids grew the agent without bound."""

from __future__ import annotations

import asyncio

from tests.unit.test_lanes_halts import _endpoint, _settle, _setup, _submit


def test_the_lane_of_an_unknown_endpoint_goes_once_its_delivery_is_dead_lettered() -> None:
    lanes, _halts, _transport, tracker = _setup(_endpoint("ep_known"))
    lanes.view_checked_ms = None  # (no grace for a view not refreshed yet)

    async def main() -> None:
        for n in range(50):
            _submit(lanes, tracker, n, endpoint_id=f"ep_made_up_{n}")
        await _settle()

    asyncio.run(main())
    items, _ = tracker.drain()
    assert sum(1 for t, _k, _v in items if t == "dlq.v1") == 50
    assert not any(eid.startswith("ep_made_up_") for eid in lanes.lanes)
