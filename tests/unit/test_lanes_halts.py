"""The agent honours anomaly halts: a delivery of a tripped scope is held (held.v1, a held
outcome naming the halt), not sent -- at intake and when the trip comes while it waits in
its lane; a person's re-drive goes out; a probe slot that sent nothing is free again."""

from __future__ import annotations

import asyncio
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.anomaly import HaltState
from postbacks.core.anomaly.halts import CONTROL_AHEAD_MS, StateChange
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


def test_a_strict_endpoint_tripped_before_its_deliveries_came_holds_them_in_order_and_resumes(
) -> None:
    lanes, halts, transport, tracker = _setup(_endpoint("ep_s", ordering="strict"))
    _trip(halts, ("endpoint", "ep_s"))

    async def main() -> tuple[list[tuple[str, str, str]], int]:
        for i in range(3):
            _submit(lanes, tracker, i, endpoint_id="ep_s", trigger="retry")
        await _settle()
        held = _held(tracker)
        _trip(halts, ("endpoint", "ep_s"), HaltState.CLOSED, NOW + 1)
        _submit(lanes, tracker, 3, endpoint_id="ep_s", trigger="conversion")
        await _settle()
        return held, len(transport.sent)

    held, sent = asyncio.run(main())
    # each held in its turn (its order state resolved), so the one after the close is
    # sent at once instead of waiting behind a head that never comes back
    assert [h[0] for h in held] == ["dlv_0", "dlv_1", "dlv_2"]
    assert sent == 1


def test_an_owners_notification_goes_out_during_a_global_halt() -> None:
    lanes, halts, transport, tracker = _setup(_endpoint("ep_owner"))
    _trip(halts, ("global", "*"))
    d = make_delivery(delivery_id="dlv_n", endpoint_id="ep_owner", created_at=NOW - 1000)
    d["conversion"] = {**d["conversion"], "event_type": "operations.anomaly.tripped",
                       "payout_usd_micros": None}

    async def main() -> list[tuple[str, str, str]]:
        lanes.submit(FakeMessage(_DLV.encode(d)),  # type: ignore[arg-type]
                     tracker.track("dispatch.v1", 0, 0))
        await _settle()
        return _held(tracker)

    assert asyncio.run(main()) == []
    assert len(transport.sent) == 1  # the owner hears of the halt


def test_a_close_dated_ahead_of_this_clock_is_honoured_when_its_date_comes() -> None:
    now = [NOW / 1000]
    halts = AgentHalts("prod", clock=lambda: now[0])
    rec: dict[str, Any] = {"scope": "global", "scope_key": "prod", "detector": "value_rate",
                           "state": "tripped", "changed_at": NOW - 60_000}
    halts.apply([rec])  # type: ignore[list-item]
    assert halts.reason("ep_a") == "halted_global"
    ahead = NOW + CONTROL_AHEAD_MS + 60_000  # written by a host 6 minutes ahead
    halts.apply([{**rec, "state": "closed", "changed_at": ahead}])  # type: ignore[list-item]
    assert halts.reason("ep_a") == "halted_global"  # refused for now
    halts.recheck()
    assert halts.reason("ep_a") == "halted_global"
    now[0] += 61
    halts.recheck()
    assert halts.reason("ep_a") is None
    other = {**rec, "scope_key": "another-deployment", "changed_at": NOW}
    halts.apply([other])  # type: ignore[list-item]
    assert halts.reason("ep_a") is None  # not this deployment's global scope


class FailsFirst(Transport):
    async def send(self, req: Any, follow_redirects: bool = False) -> SendResult:
        self.sent.append(req.body.decode())
        await asyncio.sleep(0)
        status = 503 if len(self.sent) == 1 else 200
        return SendResult(HttpResult(status, None, None), 1.0, b"x", None, b"x")


def test_a_strict_head_back_from_its_retry_during_a_halt_is_held_and_resolves_the_order(
) -> None:
    ep = _endpoint("ep_s", ordering="strict")
    halts = AgentHalts("prod")
    transport = FailsFirst()
    lanes = Lanes(Deliverer(transport, RetryPolicy(5, 3600, 86400, 0.2, 10, {}),  # type: ignore[arg-type]
                            clock=lambda: NOW / 1000),
                  {"ep_s": ep}.get, BreakerPolicy(), 30, 1000, 30, clock=lambda: NOW / 1000,
                  view_checked_ms=lambda: NOW, halted=halts.reason)
    tracker = Tracker()
    offsets = iter(range(100))

    def feed(d: Any) -> None:
        lanes.submit(FakeMessage(_DLV.encode(d), offset=(o := next(offsets))),  # type: ignore[arg-type]
                     tracker.track("dispatch.v1", 0, o))

    async def main() -> tuple[list[str], list[str], int]:
        feed(make_delivery(delivery_id="dlv_0", endpoint_id="ep_s", created_at=NOW - 1000))
        await _settle()  # its first attempt fails: it is the head, waiting in a retry tier
        feed(make_delivery(delivery_id="dlv_1", endpoint_id="ep_s", created_at=NOW - 900))
        await _settle()  # parked behind the head
        out = [(t, _DLV.decode(v)) for t, _k, v in tracker.drain()[0]
               if t.startswith(("retry.", "quarantine."))]
        assert [d["delivery_id"] for _t, d in out] == ["dlv_0", "dlv_1"], out
        _trip(halts, ("global", "*"))
        for _t, d in out:  # both come back from their tier while the scope is tripped
            feed({**d, "due_at": None})
        await _settle()
        held = [d for d, _r, _o in _held(tracker)]
        _trip(halts, ("global", "*"), HaltState.CLOSED, NOW + 1)
        feed(make_delivery(delivery_id="dlv_2", endpoint_id="ep_s", created_at=NOW - 800))
        await _settle()
        later = [t for t, _k, _v in tracker.drain()[0]]
        return held, later, len(transport.sent)

    held, later, sent = asyncio.run(main())
    assert held == ["dlv_0", "dlv_1"]
    # the order state is resolved: the delivery after the close goes out at once
    assert sent == 2, later
