"""A bug while delivering (anything the agent did not expect) dead-letters the delivery
as internal_error and tells analytics: a dead_lettered outcome (it used to have none, so
the delivery never ended on outcomes.v1)."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerPolicy
from postbacks.core.endpoint import Endpoint, SigningSecret
from postbacks.core.retry import RetryPolicy
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from streams.lanes import Lanes
from streams.offsets import Tracker
from tests.unit.factories import FakeMessage, make_delivery

NOW = 1_700_000_100_000
_DLV = codec_for("Delivery")


class Broken:
    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        raise RuntimeError("a bug in the transport")


def test_an_internal_error_is_dead_lettered_with_an_outcome() -> None:
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),))
    lanes = Lanes(Deliverer(Broken(), RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                            clock=lambda: NOW / 1000),
                  {ep.endpoint_id: ep}.get, BreakerPolicy(), 30, 1000, 30,
                  clock=lambda: NOW / 1000, view_checked_ms=lambda: NOW)
    tracker = Tracker()

    async def main() -> list[tuple[str, bytes | None, bytes]]:
        d = make_delivery(delivery_id="dlv_9", endpoint_id="ep_1", created_at=NOW - 1000)
        lanes.submit(FakeMessage(_DLV.encode(d)), tracker.track("dispatch.v1", 0, 0))  # type: ignore[arg-type]
        for _ in range(20):
            await asyncio.sleep(0)
        return tracker.drain()[0]

    items = asyncio.run(main())
    topics = [topic for topic, _k, _v in items]
    assert topics == ["dlq.v1", "outcomes.v1"], topics
    dead = codec_for("DeadLetter").decode(items[0][2])
    outcome = codec_for("Outcome").decode(items[1][2])
    assert (dead["reason"], dead["error_class"]) == ("internal_error", "RuntimeError")
    assert (outcome["kind"], outcome["reason"], outcome["delivery_id"]) == (
        "dead_lettered", "internal_error", "dlv_9")
