"""An endpoint's rolling state in the gate's table: three keys, each written when it moves;
restored exactly; a torn write can only under-count; a close survives a restart."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from postbacks.core.anomaly.endpoint_state import (
    ENDPOINT_POLICY,
    EndpointState,
    dump,
    restore,
)
from postbacks.core.anomaly.rolling import add, empty, evaluate
from postbacks.core.anomaly.rolling_codec import to_dict
from postbacks.core.anomaly.rolling_types import ENDPOINT_ROLLING, RollingOver, RollingPolicy

MIN = 60_000
HOUR = 60 * MIN
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR
USD = 1_000_000


def _json(v: Any) -> Any:
    return None if v is None else json.loads(json.dumps(v))


def _store(t: EndpointState, store: dict[str, Any]) -> tuple[EndpointState, list[str]]:
    profile, ring, open_, t = dump(t)
    written = []
    for key, value in (("profile", profile), ("ring", ring), ("open", open_)):
        if value is not None:
            store[key] = _json(value)
            written.append(key)
    return t, written


def _back(store: dict[str, Any]) -> EndpointState:
    return restore(store.get("profile"), store.get("ring"), store.get("open"))


def _same(a: EndpointState, b: EndpointState) -> None:
    assert to_dict(a.state) == to_dict(b.state)  # stored form: NaN != NaN in tuples
    assert (a.offset, a.halted, a.since) == (b.offset, b.halted, b.since)


def test_each_key_is_written_only_when_it_moves() -> None:
    store: dict[str, Any] = {}
    t = EndpointState(empty(ENDPOINT_POLICY))
    t = replace(t, state=add(t.state, T0 + 5_000, 2 * USD), offset=0)
    t, written = _store(t, store)
    assert written == ["profile", "ring", "open"]  # the first minute and hour
    t = replace(t, state=add(t.state, T0 + 9_000, 3 * USD), offset=1)
    t, written = _store(t, store)
    assert written == ["open"]  # the same minute: the running totals only
    t = replace(t, state=add(t.state, T0 + 2 * MIN, USD), offset=2)
    t, written = _store(t, store)
    assert written == ["ring", "open"]  # a minute closed
    t = replace(t, state=add(t.state, T0 + HOUR + MIN, USD), offset=3)
    t, written = _store(t, store)
    assert written == ["profile", "ring", "open"]  # an hour closed
    _same(_back(store), t)
    assert len(json.dumps(store["open"])) < 200


def test_three_weeks_restore_exactly_and_decide_the_same() -> None:
    store: dict[str, Any] = {}
    t = EndpointState(empty(ENDPOINT_POLICY))
    for i in range(3 * 168 * 4):  # a delivery every 15 minutes for three weeks
        t = replace(t, state=add(t.state, T0 + i * 15 * MIN + 7_000, (i % 7 + 1) * USD),
                    offset=i)
        if i % 5 == 0:
            t, _ = _store(t, store)
    t, _ = _store(t, store)
    back = _back(store)
    _same(back, t)
    now = T0 + 3 * 168 * HOUR + 30_000
    a = evaluate(add(t.state, now, 40 * USD), ENDPOINT_ROLLING, now_ms=now)
    b = evaluate(add(back.state, now, 40 * USD), ENDPOINT_ROLLING, now_ms=now)
    assert repr(a) == repr(b)
    assert len(json.dumps(store["ring"])) < 8_000  # per closed minute
    assert len(json.dumps(store["profile"])) < 40_000  # per closed hour


def test_an_open_value_of_another_minute_is_not_applied() -> None:
    """The ring was written for minute m+1 but the open value is older (m): the ring's own
    totals and offset stand -- an earlier flush can only under-count."""
    store: dict[str, Any] = {}
    t = EndpointState(empty(ENDPOINT_POLICY))
    t = replace(t, state=add(t.state, T0, USD), offset=0)
    t, _ = _store(t, store)
    stale_open = store["open"]
    t = replace(t, state=add(t.state, T0 + MIN, 2 * USD), offset=1)
    t = replace(t, state=add(t.state, T0 + MIN + 1, 3 * USD), offset=2)
    t, _ = _store(t, store)
    store["open"] = stale_open
    back = _back(store)
    assert (back.state.minute, back.state.cur, back.offset) == (T0 // MIN + 1, 5 * USD, 2)


def test_nothing_stored_is_an_empty_state_and_a_close_survives() -> None:
    assert _back({}).offset == -1 and _back({}).state.minute is None
    store: dict[str, Any] = {}
    t = EndpointState(empty(ENDPOINT_POLICY), halted=True)
    t = replace(t, state=add(t.state, T0, USD), offset=0)
    t, _ = _store(t, store)
    assert _back(store).halted is True
    t = replace(t, halted=False, since=T0 // MIN + 1)
    t, written = _store(t, store)
    assert written == ["open"]
    back = _back(store)
    assert (back.halted, back.since) == (False, T0 // MIN + 1)


@pytest.mark.parametrize("key,value", [
    ("ring", {"v": 1, "obs": "x", "o": 3}),
    ("ring", ["not", "an", "object"]),
    ("ring", {"o": "seven"}),
    ("profile", {"profile": 12}),
    ("open", {"halted": "yes"}),
])
def test_a_malformed_value_is_an_error(key: str, value: Any) -> None:
    store: dict[str, Any] = {}
    t = EndpointState(empty(ENDPOINT_POLICY))
    t, _ = _store(replace(t, state=add(t.state, T0, USD), offset=0), store)
    store[key] = {**store["open"], **value} if key == "open" else value
    with pytest.raises(ValueError, match="state"):
        _back(store)


def _sparse(policy: RollingPolicy) -> Any:
    """Three weeks of one $50 delivery an hour, then ten in one minute ($450 over the
    expected, past the $200 floor)."""
    s = empty(policy)
    for h in range(3 * 168):
        s = add(s, T0 + h * HOUR + 20 * MIN, 50 * USD)
    burst = T0 + 3 * 168 * HOUR + 20 * MIN
    for i in range(10):
        s = add(s, burst + i * 1000, 50 * USD)
    return evaluate(s, ENDPOINT_ROLLING, now_ms=burst + 30_000)


def test_a_burst_on_a_sparse_endpoint_trips_with_the_conversion_cap_only() -> None:
    """One $50 conversion an hour: the minute variance is so small that the sigma cap
    counts ten conversions in a minute as about $26; each conversion counting up to twice
    its slot's mean payout lets the $500 count."""
    assert isinstance(_sparse(ENDPOINT_POLICY), RollingOver)
    assert not isinstance(_sparse(RollingPolicy()), RollingOver)
