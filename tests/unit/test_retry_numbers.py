"""A delivery from another producer carrying an attempt below 0 or a first attempt in the
future: its retry keeps the backoff and the 24-hour ceiling (the attempt below 0 retried in
a tight loop; the future first attempt was carried on, so the ceiling was never reached)."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.classify import HttpResult
from postbacks.core.endpoint import Endpoint, SigningSecret
from postbacks.core.retry import RetryPolicy, ScheduleRetry, next_step
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from tests.unit.factories import make_delivery

NOW = 1_700_000_100_000


class Down:
    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        return SendResult(HttpResult(503, None, None), 1.0, b"down", None, b"down")


def test_the_retry_of_a_forged_attempt_keeps_backoff_and_ceiling() -> None:
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),))
    deliverer = Deliverer(Down(), RetryPolicy(5, 3600, 86400, 0.0, 10, {}),  # type: ignore[arg-type]
                          clock=lambda: NOW / 1000)
    d: Any = make_delivery(endpoint_id="ep_1", attempt=-2**31, first_attempt_at=2**62,
                           created_at=NOW - 1000)
    out: list[Any] = []
    asyncio.run(deliverer.deliver(None, d, ep, out))
    [retry] = [codec_for("Delivery").decode(v) for t, _, v in out if t.startswith("retry.")]
    assert retry["attempt"] == 1  # counted as the first
    assert retry["first_attempt_at"] == NOW  # not 2**62: the ceiling counts from now
    assert retry["due_at"] - NOW == 5000  # the first backoff, not none


def test_a_retry_past_the_thousandth_attempt_is_scheduled_at_the_delay_cap() -> None:
    """An endpoint allowed many attempts with a short cap: 2.0 ** 1024 used to overflow
    before the cap applied, and the delivery was dead-lettered as an internal error."""
    policy = RetryPolicy(5, 5, 86400, 0.0, 100_000, {})
    assert policy.delay_s(1_025) == 5
    assert policy.delay_s(10**9) == 5
    step = next_step(policy, attempt_no=5_000, event_type="purchase", first_attempt_ms=NOW,
                     now_ms=NOW + 3_600_000, retry_after_s=None, rand=0.5)
    assert isinstance(step, ScheduleRetry)
    assert step.due_at_ms == NOW + 3_600_000 + 5_000

