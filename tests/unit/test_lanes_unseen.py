"""Deliveries of an endpoint the agent's view has not seen yet wait in quarantine, and a
later delivery of that endpoint, seen by then, does not overtake them (the endpoint may
order its deliveries strictly)."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerPolicy
from postbacks.core.classify import HttpResult
from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.retry import RetryPolicy
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from streams.lanes import Lanes
from streams.offsets import Item, Tracker
from tests.unit.factories import FakeMessage, make_delivery

NOW = 1_700_000_100_000
_DLV = codec_for("Delivery")


class Transport:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        self.sent.append(req.body.decode())
        return SendResult(HttpResult(200, None, None), 1.0, b"ok", None, b"ok")


def test_a_seen_delivery_does_not_overtake_the_unseen_ones_before_it() -> None:
    ep = Endpoint("ep_new", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),),
                  config=EndpointConfig(ordering="strict"))
    view: dict[str, Endpoint] = {}
    transport = Transport()
    clock = [NOW / 1000]
    lanes = Lanes(Deliverer(transport, RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                            clock=lambda: clock[0]),
                  view.get, BreakerPolicy(), 30, 1000, 30, clock=lambda: clock[0],
                  view_checked_ms=lambda: 0)  # never refreshed meanwhile
    tracker = Tracker()
    quarantined: list[tuple[str, int]] = []

    def submit(d: Any, offset: int) -> None:
        slot = tracker.track("dispatch.v1", 0, offset)
        lanes.submit(FakeMessage(_DLV.encode(d), offset=offset), slot)  # type: ignore[arg-type]

    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        items: list[Item] = tracker.drain()[0]
        for topic, _k, value in items:
            if topic == "quarantine.v1":
                q = _DLV.decode(value)
                quarantined.append((q["delivery_id"], q["due_at"]))

    def delivery(n: int) -> Any:
        return make_delivery(delivery_id=f"dlv_{n}", idempotency_key=f"msg_{n}",
                             endpoint_id=ep.endpoint_id, created_at=NOW - 1000)

    async def main() -> None:
        submit(delivery(1), 0)  # not in the view: waits
        submit(delivery(2), 1)
        await settle()
        assert [q[0] for q in quarantined] == ["dlv_1", "dlv_2"]
        assert quarantined[0][1] < quarantined[1][1]  # back in the order they left
        view[ep.endpoint_id] = ep  # the view has it now (strict)
        submit(delivery(3), 2)  # seen: still behind the two out there
        await settle()
        assert [q[0] for q in quarantined] == ["dlv_1", "dlv_2", "dlv_3"]
        assert quarantined[1][1] < quarantined[2][1] and transport.sent == []
        clock[0] += 3
        for n, offset in ((1, 3), (2, 4), (3, 5)):  # the relay brings them back, in order
            back = dict(delivery(n), last_error="quarantined: endpoint_unseen")
            submit(back, offset)
            for _ in range(3):
                await settle()
        order = [next(n for n in (1, 2, 3) if f"msg_{n}" in body) for body in transport.sent]
        assert order == [1, 2, 3] and len(quarantined) == 3

    asyncio.run(main())
