"""An endpoint's Retry-After on a 429 or 503 holds the whole endpoint, not only the
delivery it answered (seed 003: honoured, "the most useful signal it will ever get"):
until then nothing more is sent to it, and new deliveries wait in quarantine, due no
earlier than the time it gave. Other endpoints are not held."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerPolicy
from postbacks.core.classify import HttpResult
from postbacks.core.retry import RetryPolicy
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from streams.lanes import Lanes
from streams.offsets import Tracker
from tests.unit.factories import FakeMessage, make_delivery
from tests.unit.test_lanes_halts import NOW, _endpoint, _settle

_DLV = codec_for("Delivery")


class RateLimits:
    """Answers 429 with ``Retry-After: 120`` to endpoint ep_busy's first request, 200 to
    everything else."""

    def __init__(self, after_s: float = 120.0) -> None:
        self.sent: list[str] = []
        self.after_s = after_s

    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        self.sent.append(req.url)
        await asyncio.sleep(0)
        if "busy" in req.url and len([u for u in self.sent if "busy" in u]) == 1:
            return SendResult(HttpResult(429, None, self.after_s), 1.0, b"", None, b"")
        return SendResult(HttpResult(200, None, None), 1.0, b"ok", None, b"ok")


def test_a_429_with_retry_after_holds_the_endpoint_until_then() -> None:
    busy = dataclasses.replace(_endpoint("ep_busy"), url="https://busy.example/")
    eps = {"ep_busy": busy, "ep_calm": _endpoint("ep_calm")}
    transport = RateLimits()
    lanes = Lanes(Deliverer(transport, RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                            clock=lambda: NOW / 1000),
                  eps.get, BreakerPolicy(), 30, 1000, 30, clock=lambda: NOW / 1000,
                  view_checked_ms=lambda: NOW)
    tracker = Tracker()
    offsets = iter(range(100))

    def feed(eid: str, n: int) -> None:
        d = make_delivery(delivery_id=f"dlv_{eid}_{n}", endpoint_id=eid, created_at=NOW - 1000)
        o = next(offsets)
        lanes.submit(FakeMessage(_DLV.encode(d), offset=o), tracker.track("dispatch.v1", 0, o))  # type: ignore[arg-type]

    async def main() -> list[tuple[str, Any]]:
        feed("ep_busy", 0)
        await _settle()  # answered 429, Retry-After 120 s
        for n in range(1, 4):
            feed("ep_busy", n)
            feed("ep_calm", n)
        await _settle()
        return [(t, _DLV.decode(v)) for t, _k, v in tracker.drain()[0]
                if t.startswith(("retry.", "quarantine."))]

    out = asyncio.run(main())
    busy_sent = [u for u in transport.sent if "busy" in u]
    assert len(busy_sent) == 1, transport.sent  # nothing more after its 429
    assert len([u for u in transport.sent if "busy" not in u]) == 3  # the other endpoint goes on
    retried = [d for t, d in out if not (d["last_error"] or "").startswith("quarantined")]
    held = [d for t, d in out if (d["last_error"] or "").startswith("quarantined")]
    # due in 2 minutes: they wait in the retry tier that fits, not in quarantine.v1, where
    # they would hold other endpoints' diverts on the partition (core/quarantine.py)
    assert {t for t, d in out if d in held} == {"retry.2m.v1"}
    assert [d["delivery_id"] for d in retried] == ["dlv_ep_busy_0"]
    assert retried[0]["due_at"] >= NOW + 120_000
    assert sorted(d["delivery_id"] for d in held) == [f"dlv_ep_busy_{n}" for n in range(1, 4)]
    assert all(d["due_at"] >= NOW + 120_000 for d in held)
    assert all(d["attempt"] == 0 for d in held)  # no attempt used


def test_a_breaker_divert_during_the_hold_comes_back_no_earlier_than_it() -> None:
    """Behind an open breaker (reopening in 5 minutes) and a Retry-After of an hour, the
    deliveries diverted come back after the hour, not at the reopening only to be
    quarantined again."""
    from postbacks.core.breaker import BreakerState

    busy = dataclasses.replace(_endpoint("ep_busy"), url="https://busy.example/")
    transport = RateLimits(after_s=3600.0)
    lanes = Lanes(Deliverer(transport, RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                            clock=lambda: NOW / 1000),
                  {"ep_busy": busy}.get, BreakerPolicy(), 30, 1000, 30,
                  clock=lambda: NOW / 1000, view_checked_ms=lambda: NOW)
    tracker = Tracker()

    async def main() -> list[Any]:
        d = make_delivery(delivery_id="dlv_0", endpoint_id="ep_busy", created_at=NOW - 1000)
        lanes.submit(FakeMessage(_DLV.encode(d), offset=0), tracker.track("dispatch.v1", 0, 0))  # type: ignore[arg-type]
        await _settle()
        lanes.adopt("ep_busy", BreakerState(state="open", opened_at_ms=NOW, changed_ms=NOW))
        d = make_delivery(delivery_id="dlv_1", endpoint_id="ep_busy", created_at=NOW - 900)
        lanes.submit(FakeMessage(_DLV.encode(d), offset=1), tracker.track("dispatch.v1", 0, 1))  # type: ignore[arg-type]
        await _settle()
        return [_DLV.decode(v) for t, _k, v in tracker.drain()[0]
                if (t.startswith("retry.") and b"quarantined" in v)]

    held = asyncio.run(main())
    assert [d["delivery_id"] for d in held] == ["dlv_1"]
    assert held[0]["due_at"] >= NOW + 3_600_000
    assert "breaker_open" in (held[0]["last_error"] or "")
