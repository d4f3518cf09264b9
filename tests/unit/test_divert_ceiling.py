"""A delivery diverted again and again (behind an open breaker, one probe per open period)
ends at the retry ceiling like a retry does: exhausted, dead-lettered, with an outcome. It
used to go round quarantine -> relay -> dispatch for days past the 24 h ceiling."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerPolicy, BreakerState
from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.retry import RetryPolicy
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from streams.lanes import Lanes
from streams.offsets import Tracker
from tests.unit.factories import FakeMessage, make_delivery

NOW = 1_700_000_100_000
HOUR_MS = 3_600_000
_DLV = codec_for("Delivery")


class Unused:
    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        raise AssertionError("nothing is sent while the breaker is open")


def _diverted(first_attempt_at: int, strict: bool = False) -> list[tuple[str, Any]]:
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),),
                  config=EndpointConfig(ordering="strict" if strict else "none"))
    lanes = Lanes(Deliverer(Unused(), RetryPolicy(5, 3600, 24 * 3600, 0.2, 50, {}),  # type: ignore[arg-type]
                            clock=lambda: NOW / 1000),
                  {ep.endpoint_id: ep}.get, BreakerPolicy(), 30, 1000, 30,
                  clock=lambda: NOW / 1000, view_checked_ms=lambda: NOW)
    tracker = Tracker()

    async def main() -> list[tuple[str, bytes | None, bytes]]:
        lanes.adopt("ep_1", BreakerState(state="open", opened_at_ms=NOW - 1000,
                                         changed_ms=NOW - 1000))
        d = make_delivery(delivery_id="dlv_7", endpoint_id="ep_1", attempt=4,
                          first_attempt_at=first_attempt_at, created_at=first_attempt_at)
        lanes.submit(FakeMessage(_DLV.encode(d)), tracker.track("dispatch.v1", 0, 0))  # type: ignore[arg-type]
        for _ in range(20):
            await asyncio.sleep(0)
        return tracker.drain()[0]

    codecs = {"dlq.v1": codec_for("DeadLetter"), "outcomes.v1": codec_for("Outcome"),
              "quarantine.v1": _DLV, "retry.2m.v1": _DLV}
    return [(t, codecs[t].decode(v)) for t, _k, v in asyncio.run(main())]


def test_within_the_ceiling_a_divert_waits_in_quarantine() -> None:
    out = _diverted(NOW - 2 * HOUR_MS)
    # until the breaker reopens in 5 minutes: in the retry tier that fits (quarantine.v1
    # takes diverts due within a minute; core/quarantine.py)
    assert [t for t, _ in out] == ["retry.2m.v1", "outcomes.v1"]
    assert out[0][1]["last_error"] == "quarantined: breaker_open"


def test_past_the_ceiling_it_is_exhausted_not_diverted_again() -> None:
    for strict in (False, True):
        out = _diverted(NOW - 24 * HOUR_MS, strict=strict)
        assert [t for t, _ in out] == ["dlq.v1", "outcomes.v1"], (strict, out)
        assert out[0][1]["reason"] == "exhausted"
        assert (out[1][1]["kind"], out[1][1]["reason"]) == ("exhausted", "breaker_open")


def test_a_strict_head_ended_at_the_ceiling_lets_the_next_one_go() -> None:
    """The head of a strict endpoint came back from quarantine, met the breaker still
    open and was exhausted: the endpoint's order state still named it, and every later
    delivery waited behind it for good (its partition's commits with them)."""
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),),
                  config=EndpointConfig(ordering="strict"))
    clock = [NOW / 1000]
    lanes = Lanes(Deliverer(Unused(), RetryPolicy(5, 3600, 24 * 3600, 0.2, 50, {}),  # type: ignore[arg-type]
                            clock=lambda: clock[0]),
                  {ep.endpoint_id: ep}.get, BreakerPolicy(), 30, 1000, 30,
                  clock=lambda: clock[0], view_checked_ms=lambda: int(clock[0] * 1000))
    tracker = Tracker()
    out: list[tuple[str, str]] = []

    async def submit(d: Any, offset: int) -> None:
        lanes.adopt("ep_1", BreakerState(state="open", opened_at_ms=int(clock[0] * 1000),
                                         changed_ms=int(clock[0] * 1000)))
        lanes.submit(FakeMessage(_DLV.encode(d), offset=offset),
                     tracker.track("dispatch.v1", 0, offset))  # type: ignore[arg-type]
        for _ in range(20):
            await asyncio.sleep(0)
        for topic, _k, v in tracker.drain()[0]:
            if topic in ("retry.2m.v1", "dlq.v1"):  # (the breaker reopens in 5 min)
                decoded = (_DLV if topic == "retry.2m.v1" else codec_for("DeadLetter")).decode(v)
                out.append((topic, str(decoded.get("delivery_id")
                                       or _DLV.decode(decoded["original_value"])["delivery_id"])))

    async def main() -> None:
        first = NOW - 23 * HOUR_MS
        head = make_delivery(delivery_id="dlv_7", endpoint_id="ep_1", attempt=4,
                             first_attempt_at=first, created_at=first)
        await submit(head, 0)  # diverted: the endpoint's head, waiting in quarantine
        clock[0] += 2 * 3600  # past the ceiling, it comes back (the breaker open again)
        back = dict(head, last_error="quarantined: breaker_open")
        await submit(back, 1)
        nxt = make_delivery(delivery_id="dlv_8", endpoint_id="ep_1",
                            created_at=int(clock[0] * 1000))
        await submit(nxt, 2)

    asyncio.run(main())
    assert out == [("retry.2m.v1", "dlv_7"), ("dlq.v1", "dlv_7"), ("retry.2m.v1", "dlv_8")]
