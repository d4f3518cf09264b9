"""An endpoint's max_attempts caps every limit, also an event type's own
(POSTBACKS_RETRY_MAX_ATTEMPTS_BY_EVENT_TYPE): it used to win over the endpoint's cap, so a
publisher that asked for 3 attempts got 10."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.classify import HttpResult
from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.retry import RetryPolicy
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from tests.unit.factories import FakeMessage, make_conversion, make_delivery

NOW = 1_700_000_100_000


class Failing:
    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        return SendResult(HttpResult(503, None, None), 1.0, b"busy", None, b"busy")


def _after_attempt(attempt: int, event_type: str) -> list[str]:
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),),
                  config=EndpointConfig(max_attempts=3))
    policy = RetryPolicy(5, 3600, 86400, 0.2, 50, {"conversion": 10, "install": 10})
    deliverer = Deliverer(Failing(), policy, clock=lambda: NOW / 1000)  # type: ignore[arg-type]
    d = make_delivery(attempt=attempt, first_attempt_at=NOW - 60_000, created_at=NOW - 60_000,
                      conversion=make_conversion(event_type=event_type))
    out: list[Any] = []
    asyncio.run(deliverer.deliver(FakeMessage(codec_for("Delivery").encode(d)), d, ep, out))
    return [topic for topic, _k, _v in out]


def test_the_endpoint_cap_bounds_an_event_types_own_limit() -> None:
    assert "dlq.v1" not in _after_attempt(1, "conversion")  # the 2nd attempt: retried
    done = _after_attempt(2, "conversion")  # the 3rd attempt, the endpoint's last
    assert "dlq.v1" in done and not any(t.startswith("retry.") for t in done), done
