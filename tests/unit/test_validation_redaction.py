"""What a receiver quotes back is masked wherever the agent stores it: a failed
validation's reason (the json_field validator quotes the receiver's value) reached the
attempt's error_message, the held record's last_error and the outcome's reason unmasked,
where the response excerpt beside it was masked."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.core.classify import HttpResult
from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.retry import RetryPolicy
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from tests.unit.factories import make_delivery

NOW = 1_700_000_100_000


class Echo:
    """A receiver answering 200 with a body quoting the API key it was sent."""

    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        body = b'{"status": "rejected key k-live-0123456789"}'
        return SendResult(HttpResult(200, None, None), 1.0, body, None, body)


def test_a_failed_validation_quoting_the_api_key_stores_it_masked() -> None:
    config = EndpointConfig.from_json({
        "headers": {"X-Api-Key": "k-live-0123456789"},
        "validator": {"kind": "json_field", "field": "status", "op": "equals", "value": "ok"}})
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}), config=config,
                  secrets=(SigningSecret("s1", b"k" * 32, 0),))
    deliverer = Deliverer(Echo(), RetryPolicy(5, 3600, 86400, 0.0, 10, {}),  # type: ignore[arg-type]
                          clock=lambda: NOW / 1000)
    out: list[Any] = []
    asyncio.run(deliverer.deliver(None, make_delivery(endpoint_id="ep_1", created_at=NOW - 1000),
                                  ep, out))
    topics = [t for t, _k, _v in out]
    assert "held.v1" in topics, topics
    stored = b"".join(v for _t, _k, v in out)
    assert b"k-live-0123456789" not in stored
    assert b"rejected key [redacted]" in stored  # the reason is kept, the key masked
