"""A disabled endpoint's breaker is not shown open for ever: its deliveries are parked before
the breaker, so nothing probes it and it never closes."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from postbacks.codec import codec_for
from postbacks.core.breaker import BreakerPolicy, BreakerState
from postbacks.core.endpoint import Endpoint
from postbacks.core.retry import RetryPolicy
from postbacks.metrics import BREAKER_OPEN
from streams.delivery import Deliverer
from streams.lanes import Lanes
from streams.offsets import Tracker
from tests.unit.factories import make_delivery


class Msg:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


def shown(endpoint_id: str) -> bool:
    return any(s.labels.get("endpoint") == endpoint_id
               for m in BREAKER_OPEN.collect() for s in m.samples)


def test_a_disabled_endpoints_breaker_is_not_shown_open() -> None:
    ep = Endpoint("ep_gauge", "app_1", "https://x.example/", frozenset({"*"}))
    view: dict[str, Endpoint] = {ep.endpoint_id: ep}
    lanes = Lanes(Deliverer(None, RetryPolicy(5, 3600, 86400, 0.2, 10, {})),  # type: ignore[arg-type]
                  view.get, BreakerPolicy(), 30, 1000, 30)
    now_ms = int(time.time() * 1000)
    lanes.adopt(ep.endpoint_id, BreakerState("open", 20, now_ms, changed_ms=now_ms))
    assert shown(ep.endpoint_id)  # open, enabled: shown
    view[ep.endpoint_id] = dataclasses.replace(ep, disabled_at_ms=now_ms)
    slot = Tracker().track("dispatch.v1", 0, 0)
    d: Any = make_delivery(endpoint_id=ep.endpoint_id)
    lanes.submit(Msg(codec_for("Delivery").encode(d)), slot)  # type: ignore[arg-type]
    assert not shown(ep.endpoint_id)  # parked: the breaker is not shown open

    # an open breaker learnt from another agent (or breakers.v1 at a restart) for an
    # endpoint that is disabled: not shown either
    other = dataclasses.replace(ep, endpoint_id="ep_gauge_2", disabled_at_ms=now_ms)
    view[other.endpoint_id] = other
    lanes.adopt(other.endpoint_id, BreakerState("open", 20, now_ms, changed_ms=now_ms))
    assert not shown(other.endpoint_id)

    # ... nor for an endpoint not in the view at all: the view holds enabled endpoints
    # only, so one disabled (or deleted) since is simply missing; breakers.v1 kept its
    # last state, open, and every agent start showed it open again, for ever
    lanes.adopt("ep_gauge_gone", BreakerState("open", 20, now_ms, changed_ms=now_ms))
    assert not shown("ep_gauge_gone")
