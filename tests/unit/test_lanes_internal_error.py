"""A bug while delivering (anything the agent did not expect) dead-letters the delivery
as internal_error and tells analytics: a dead_lettered outcome (it used to have none, so
the delivery never ended on outcomes.v1)."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerPolicy, BreakerState
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


def _lanes(ep: Endpoint, view: dict[str, Endpoint] | None = None) -> Lanes:
    return Lanes(Deliverer(Broken(), RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                           clock=lambda: NOW / 1000),
                 (view or {ep.endpoint_id: ep}).get, BreakerPolicy(), 30, 1000, 30,
                 clock=lambda: NOW / 1000, view_checked_ms=lambda: NOW)


def test_a_record_the_divert_fails_on_is_dead_lettered_and_the_ones_beside_it_diverted() -> None:
    """Another producer's delivery counting thousands of diverts in its last_error, to an
    endpoint whose breaker is open: int() refused the count, the error left submit, and
    the agent restarted on the same record for as long as the breaker stayed open."""
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),))
    lanes = _lanes(ep)
    lanes.adopt("ep_1", BreakerState("open", 20, NOW, changed_ms=NOW))
    tracker = Tracker()
    odd = make_delivery(delivery_id="dlv_odd", endpoint_id="ep_1", created_at=NOW - 1000,
                        last_error="quarantined (" + "9" * 5000 + "): over_budget")
    plain = make_delivery(delivery_id="dlv_ok", endpoint_id="ep_1", created_at=NOW - 1000)
    lanes.submit(FakeMessage(_DLV.encode(odd)), tracker.track("dispatch.v1", 0, 0))  # type: ignore[arg-type]
    lanes.submit(FakeMessage(_DLV.encode(plain)), tracker.track("dispatch.v1", 0, 1))  # type: ignore[arg-type]
    items, commits = tracker.drain()
    assert commits[("dispatch.v1", 0)][0] == 2  # both finished: nothing stalls
    diverted = [_DLV.decode(v) for t, _k, v in items  # (open 5 min: a retry tier waits)
                if t == "quarantine.v1" or t.startswith("retry.")]
    assert [d["delivery_id"] for d in diverted] == ["dlv_odd", "dlv_ok"]
    assert diverted[0]["last_error"] == "quarantined (1000000000): breaker_open"


def test_a_bug_before_the_lane_dead_letters_the_record_and_the_agent_goes_on(
        monkeypatch: Any) -> None:
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),))
    lanes = _lanes(ep)

    def broken(_d: Any) -> str | None:
        raise KeyError("a bug in the halts")

    monkeypatch.setattr(lanes, "_halt", broken)
    tracker = Tracker()
    d = make_delivery(delivery_id="dlv_7", endpoint_id="ep_1", created_at=NOW - 1000)
    lanes.submit(FakeMessage(_DLV.encode(d)), tracker.track("dispatch.v1", 0, 0))  # type: ignore[arg-type]
    items, commits = tracker.drain()
    assert commits[("dispatch.v1", 0)][0] == 1
    assert [t for t, _k, _v in items] == ["dlq.v1", "outcomes.v1"]
    dead = codec_for("DeadLetter").decode(items[0][2])
    assert (dead["reason"], dead["error_class"], dead["delivery_id"]) == (
        "internal_error", "KeyError", "dlv_7")


def _divert_odd_then_ok(lanes: Lanes, monkeypatch: Any) -> list[Any]:
    """Behind an open breaker, two deliveries diverted, the first failing in the divert:
    the outputs of both, once every slot is finished (asserted)."""
    lanes.adopt("ep_1", BreakerState("open", 20, NOW, changed_ms=NOW))
    quarantine = lanes.deliverer.quarantine

    def odd(out: Any, d: Any, *args: Any) -> None:
        if d["delivery_id"] == "dlv_odd":
            raise ValueError("a bug in the divert")
        quarantine(out, d, *args)

    monkeypatch.setattr(lanes.deliverer, "quarantine", odd)
    tracker = Tracker()
    for offset, name in enumerate(("dlv_odd", "dlv_ok")):
        d = make_delivery(delivery_id=name, endpoint_id="ep_1", created_at=NOW - 1000)
        lanes.submit(FakeMessage(_DLV.encode(d)), tracker.track("dispatch.v1", 0, offset))  # type: ignore[arg-type]
    items, commits = tracker.drain()
    assert commits[("dispatch.v1", 0)][0] == 2  # both finished: nothing stalls
    return items


def test_a_bug_in_a_divert_dead_letters_that_record_only(monkeypatch: Any) -> None:
    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),))
    items = _divert_odd_then_ok(_lanes(ep), monkeypatch)
    topics = [t for t, _k, _v in items]
    assert topics[:2] == ["dlq.v1", "outcomes.v1"] and topics[2].startswith("retry."), topics
    assert codec_for("DeadLetter").decode(items[0][2])["delivery_id"] == "dlv_odd"


def test_a_bug_in_a_strict_endpoints_divert_dead_letters_it_and_its_followers_go_on(
        monkeypatch: Any) -> None:
    from postbacks.core.endpoint import EndpointConfig
    from streams.strict import StrictOrder

    ep = Endpoint("ep_1", "app_1", "https://x.example/", frozenset({"*"}),
                  config=EndpointConfig.from_json({"ordering": "strict"}),
                  secrets=(SigningSecret("s1", b"k" * 32, 0),))
    lanes = _lanes(ep)
    lanes.strict = StrictOrder(lanes.deliverer, lambda: NOW)
    items = _divert_odd_then_ok(lanes, monkeypatch)
    topics = [t for t, _k, _v in items]
    assert topics[:2] == ["dlq.v1", "outcomes.v1"], topics
    diverted = [_DLV.decode(v)["delivery_id"] for t, _k, v in items
                if t == "quarantine.v1" or t.startswith("retry.")]
    assert diverted == ["dlv_ok"]  # the next one went its way: the odd one was resolved
