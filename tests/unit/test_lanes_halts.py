"""The agent honours anomaly halts: a delivery of a tripped scope is held (held.v1, a held
outcome naming the halt), not sent -- at intake and when the trip comes while it waits in
its lane; a person's re-drive goes out; a probe slot that sent nothing is free again."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.anomaly import HaltState
from postbacks.core.anomaly.halts import StateChange
from postbacks.core.breaker import BreakerPolicy, BreakerState, unused
from postbacks.core.classify import HttpResult
from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.retry import RetryPolicy
from postbacks.transport.http import SendResult
from streams.delivery import Deliverer
from streams.halts import AgentHalts
from streams.lanes import Lanes
from streams.offsets import Tracker
from tests.unit.factories import FakeMessage, make_delivery

NOW = 1_700_000_100_000
_DLV = codec_for("Delivery")
_OUT = codec_for("Outcome")


class Transport:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        self.sent.append(req.body.decode())
        await asyncio.sleep(0)
        return SendResult(HttpResult(200, None, None), 1.0, b"ok", None, b"ok")


def _endpoint(eid: str, **config: Any) -> Endpoint:
    return Endpoint(eid, "app_1", "https://x.example/", frozenset({"*"}),
                    secrets=(SigningSecret("s1", b"k" * 32, 0),),
                    config=EndpointConfig(**config), concurrency=1)


def _setup(*endpoints: Endpoint) -> tuple[Lanes, AgentHalts, Transport, Tracker]:
    halts = AgentHalts("prod")
    transport = Transport()
    view = {e.endpoint_id: e for e in endpoints}
    lanes = Lanes(Deliverer(transport, RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                            clock=lambda: NOW / 1000),
                  view.get, BreakerPolicy(), 30, 1000, 30, clock=lambda: NOW / 1000,
                  view_checked_ms=lambda: NOW, halted=halts.reason)
    return lanes, halts, transport, Tracker()


def _trip(halts: AgentHalts, scope: tuple[str, str], state: HaltState = HaltState.TRIPPED,
          at: int = NOW) -> None:
    halts.book.apply(StateChange(scope, "value_rate", state, at))


def _submit(lanes: Lanes, tracker: Tracker, offset: int, **over: Any) -> None:
    d = make_delivery(delivery_id=f"dlv_{offset}", created_at=NOW - 1000, **over)
    lanes.submit(FakeMessage(_DLV.encode(d), offset=offset),  # type: ignore[arg-type]
                 tracker.track("dispatch.v1", 0, offset))


async def _settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


def _held(tracker: Tracker) -> list[tuple[str, str, str]]:
    """(delivery id, hold reason, outcome reason) of everything held."""
    items = tracker.drain()[0]
    held = {(d := _DLV.decode(v))["delivery_id"]: d["hold_reason"]
            for t, _k, v in items if t == "held.v1"}
    why = {(o := _OUT.decode(v))["delivery_id"]: o["reason"]
           for t, _k, v in items if t == "outcomes.v1" and _OUT.decode(v)["kind"] == "held"}
    assert held.keys() == why.keys()
    return sorted((i, held[i], why[i]) for i in held)


def test_a_global_halt_holds_every_endpoint_and_lets_re_drives_through() -> None:
    lanes, halts, transport, tracker = _setup(_endpoint("ep_a"), _endpoint("ep_b"))
    _trip(halts, ("global", "*"))

    async def main() -> list[tuple[str, str, str]]:
        _submit(lanes, tracker, 0, endpoint_id="ep_a", trigger="retry")
        _submit(lanes, tracker, 1, endpoint_id="ep_b", trigger="conversion")
        _submit(lanes, tracker, 2, endpoint_id="ep_a", trigger="release")  # a person's
        _submit(lanes, tracker, 3, endpoint_id="ep_b", trigger="manual")
        await _settle()
        return _held(tracker)

    assert asyncio.run(main()) == [("dlv_0", "halted_global", "halted_global"),
                                   ("dlv_1", "halted_global", "halted_global")]
    assert len(transport.sent) == 2  # the release and the replay


def test_an_endpoint_halt_holds_that_endpoint_only_and_a_close_lifts_it() -> None:
    lanes, halts, transport, tracker = _setup(_endpoint("ep_a"), _endpoint("ep_b"))
    _trip(halts, ("endpoint", "ep_a"))

    async def main() -> tuple[list[tuple[str, str, str]], int]:
        _submit(lanes, tracker, 0, endpoint_id="ep_a", trigger="retry")
        _submit(lanes, tracker, 1, endpoint_id="ep_b", trigger="retry")
        await _settle()
        held = _held(tracker)
        _trip(halts, ("endpoint", "ep_a"), HaltState.CLOSED, NOW + 1)
        _submit(lanes, tracker, 2, endpoint_id="ep_a", trigger="retry")
        await _settle()
        return held + _held(tracker), len(transport.sent)

    held, sent = asyncio.run(main())
    assert held == [("dlv_0", "halted_endpoint", "halted_endpoint")]
    assert sent == 2  # ep_b's, and ep_a's after the close


def test_a_trip_while_a_delivery_waits_in_its_lane_holds_it_there() -> None:
    lanes, halts, transport, tracker = _setup(_endpoint("ep_a"))

    async def main() -> list[tuple[str, str, str]]:
        _submit(lanes, tracker, 0, endpoint_id="ep_a", trigger="retry")
        await asyncio.sleep(0)  # its send starts
        for i in (1, 2):  # concurrency 1: they wait behind it in the lane
            _submit(lanes, tracker, i, endpoint_id="ep_a", trigger="retry")
        _trip(halts, ("global", "*"))
        await _settle()
        return _held(tracker)

    assert asyncio.run(main()) == [("dlv_1", "halted_global", "halted_global"),
                                   ("dlv_2", "halted_global", "halted_global")]
    assert len(transport.sent) == 1  # it was on the wire before the trip


def test_a_strict_endpoint_held_at_its_head_lets_the_next_one_be_judged() -> None:
    lanes, halts, transport, tracker = _setup(_endpoint("ep_s", ordering="strict"))

    async def main() -> list[tuple[str, str, str]]:
        _submit(lanes, tracker, 0, endpoint_id="ep_s", trigger="retry")
        await asyncio.sleep(0)  # its send starts
        _submit(lanes, tracker, 1, endpoint_id="ep_s", trigger="retry")
        _trip(halts, ("endpoint", "ep_s"))
        await _settle()
        return _held(tracker)

    held = asyncio.run(main())
    # the head was sent before the trip; the one behind it is held (resolved), not stuck
    assert held == [("dlv_1", "halted_endpoint", "halted_endpoint")]
    assert len(transport.sent) == 1


def test_a_probe_slot_that_sent_nothing_is_free_again() -> None:
    probing = BreakerState("half_open", 5, NOW - 60_000, 0, changed_ms=NOW,
                           probe_in_flight=True)
    assert unused(probing, probe=True).probe_in_flight is False
    assert unused(probing, probe=False) is probing
    adopted = BreakerState("half_open", 5, NOW - 60_000, 0, changed_ms=NOW,
                           probe_in_flight=True, probe_until_ms=NOW + 30_000)
    assert unused(adopted, probe=True) is adopted  # another agent's probe: not ours to free
