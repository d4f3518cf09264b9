"""A lane's pace is the endpoint's answer time, not the agent's wait on its own intent
record: in a broker's failover the intent waited seconds for its acknowledgement, every
endpoint looked seconds slow, went over its budget into quarantine, and its deliveries
came back spaced by that pace over minutes."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerPolicy
from postbacks.core.retry import RetryPolicy
from streams.delivery import Deliverer
from streams.lanes import Lanes
from streams.offsets import Tracker
from tests.unit.factories import FakeMessage, make_delivery
from tests.unit.test_lanes_halts import NOW, Transport, _endpoint

_DLV = codec_for("Delivery")


class SlowIntents:
    """An intent log whose acknowledgements take ``wait_s`` (a broker failing over)."""

    def __init__(self, wait_s: float) -> None:
        self.wait_s, self.sent = wait_s, 0

    async def send(self, _topic: str, _key: bytes | None, _value: bytes) -> None:
        await asyncio.sleep(self.wait_s)
        self.sent += 1


def _lanes(intents: Any, transport: Transport | None = None) -> tuple[Lanes, Transport]:
    transport = transport or Transport()
    ep = _endpoint("ep_1")
    deliverer = Deliverer(transport, RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                          clock=lambda: NOW / 1000, intents=intents)
    lanes = Lanes(deliverer, {"ep_1": ep}.get, BreakerPolicy(), 30, 1000, 30,
                  clock=lambda: NOW / 1000, view_checked_ms=lambda: NOW)
    return lanes, transport


async def _send_three(lanes: Lanes, transport: Transport) -> float:
    """Three deliveries to ep_1, one after another (its concurrency is 1): its pace once
    all three were sent and answered."""
    tracker = Tracker()
    for offset in range(3):
        d = make_delivery(delivery_id=f"dlv_{offset}", endpoint_id="ep_1",
                          created_at=NOW - 1000)
        lanes.submit(FakeMessage(_DLV.encode(d), offset=offset),  # type: ignore[arg-type]
                     tracker.track("dispatch.v1", 0, offset))
    lane = lanes.lanes["ep_1"]
    for _ in range(200):  # sent, and the last answer observed (in_flight drops with it)
        if len(transport.sent) == 3 and lane.in_flight == 0:
            break
        await asyncio.sleep(0.05)
    return lane.latency_s


def test_the_wait_on_the_intent_is_not_the_endpoints_pace() -> None:
    async def main() -> tuple[float, int, int]:
        intents = SlowIntents(0.3)
        lanes, transport = _lanes(intents)
        pace = await _send_three(lanes, transport)
        return pace, intents.sent, len(transport.sent)

    pace, intents_sent, sent = asyncio.run(main())
    assert (intents_sent, sent) == (3, 3)
    assert pace < 0.1, pace  # the receiver answers at once; the 0.3 s were the agent's


class QueuedTransport(Transport):
    """Sends that each waited ``wait_s`` for a slot among the client's requests in flight
    (other endpoints' slow requests holding them) and then got their answer at once."""

    def __init__(self, wait_s: float) -> None:
        super().__init__()
        self.wait_s = wait_s

    async def send(self, req: Any, follow_redirects: bool = False) -> Any:
        await asyncio.sleep(self.wait_s)
        result = await super().send(req, follow_redirects)
        return dataclasses.replace(result, queued_s=self.wait_s)


def test_the_wait_for_the_clients_limit_is_not_the_endpoints_pace() -> None:
    async def main() -> tuple[float, int]:
        lanes, transport = _lanes(None, QueuedTransport(0.3))
        return await _send_three(lanes, transport), len(transport.sent)

    pace, sent = asyncio.run(main())
    assert sent == 3
    assert pace < 0.1, pace  # the receiver answers at once; the 0.3 s were others' requests
