"""The gate's sync core (config, halts, engine, aggregator) over a dict standing in for a table."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from postbacks.codec import codec_for
from postbacks.core.anomaly import (
    GLOBAL_SCOPE,
    RETRODATING_WINDOW_MS,
    Detector,
    GateModes,
    HaltState,
    Mode,
    Trip,
)
from postbacks.core.anomaly.detectors import MAX_AHEAD_MS
from postbacks.core.anomaly.endpoint_state import restore
from postbacks.core.anomaly.rolling import ENDPOINT_ROLLING, GLOBAL_ROLLING
from postbacks.core.anomaly.rolling_codec import to_dict
from postbacks.core.anomaly.windows import DAY_MS, HOUR_MS
from postbacks.core.instants import MIN_OCCURRED_AT_MS
from postbacks.db.anomaly import AnomalyRow
from streams.anomaly_gate.config import HaltBook, StateChange, build_config, core_scope
from streams.anomaly_gate.engine import (
    BatchOut,
    GateEngine,
    In,
    open_key,
    profile_key,
    ring_key,
)
from tests.unit.factories import make_conversion, make_delivery

GKEY = "unit-global"
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS  # an hour boundary
NOW = 1_800_000_000_000
USD = 1_000_000
DELIVERY, OUTCOME = codec_for("Delivery"), codec_for("Outcome")
DLQ, PARTIAL = codec_for("DeadLetter"), codec_for("PayoutPartial")
OFF, DET, ENF = Mode.OFF, Mode.DETECT, Mode.ENFORCE
EP_SCOPE = ("endpoint", "ep_1")


def row(scope: str, key: str, detector: str, mode: str, params: dict[str, Any] | None = None,
        state: str = "closed", changed: int | None = None) -> AnomalyRow:
    return AnomalyRow(scope, key, detector, mode, params or {}, state, changed, None)


def gate(*rows: AnomalyRow) -> GateEngine:
    cfg, states = build_config(rows, GKEY)
    book = HaltBook()
    for s in states:
        book.apply(s)
    return GateEngine(cfg, book)


def rec(offset: int, ep: str = "ep_1", at: int = T0 + 60_000, partition: int = 0,
        **conv: Any) -> In:
    conversion = make_conversion(event_id=f"evt_{offset}", occurred_at=at, **conv)
    d = make_delivery(delivery_id=f"dlv_{ep}_{offset}", endpoint_id=ep, conversion=conversion)
    return In("deliveries.v1", partition, offset, ep.encode(), DELIVERY.encode(d))


def run(engine: GateEngine, store: dict[str, Any], batch: list[In], now: int = NOW) -> BatchOut:
    out = engine.process(batch, store.get, now)
    for _, k, v in engine.take_writes():
        store[k] = json.loads(json.dumps(v))
    return out


def on(out: BatchOut, topic: str, codec: Any = DELIVERY) -> list[dict[str, Any]]:
    return [codec.decode(v) for t, _, v in out.records if t == topic]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


RETRO: dict[str, Any] = {"source_completed_at": T0 - 8 * DAY_MS, "source_created_at": T0}


def test_build_config_resolves_modes_thresholds_and_windows() -> None:
    rows = [
        row("endpoint", "ep_1", "value_rate", "enforce",
            {"multiple": 3.0, "floor_micros": USD, "k": 5.0}),
        row("endpoint", "ep_2", "retrodating", "detect", {"window_ms": 1000}),
        row("endpoint", "ep_3", "value_rate", "detect", {"multiple": "lots"}),
        row("global", GKEY, "value_rate", "detect", {"multiple": 2.0, "floor_micros": 5}),
        row("global", "another-deployment", "retrodating", "enforce"),
        row("endpoint", "ep_1", "no_such_detector", "enforce"),
        row("endpoint", "ep_1", "retrodating", "loud"),
    ]
    cfg, states = build_config(rows, GKEY)
    assert cfg.modes("ep_1") == GateModes(OFF, ENF, DET)
    assert cfg.modes("ep_2") == GateModes(DET, OFF, DET)
    assert cfg.modes("ep_9") == GateModes(OFF, OFF, DET)
    assert cfg.thresholds("ep_1") == replace(ENDPOINT_ROLLING, multiple=3.0, floor_micros=USD,
                                             k=5.0)
    assert cfg.thresholds("ep_3") == ENDPOINT_ROLLING  # unparseable params: defaults
    assert cfg.thresholds("ep_9") == ENDPOINT_ROLLING
    assert cfg.global_rolling == replace(GLOBAL_ROLLING, multiple=2.0, floor_micros=5)
    assert cfg.global_mode is DET
    assert cfg.window_ms("ep_2") == 1000
    assert cfg.window_ms("ep_1") == RETRODATING_WINDOW_MS
    assert [s.scope for s in states] == [EP_SCOPE, ("endpoint", "ep_2"), ("endpoint", "ep_3"),
                                         GLOBAL_SCOPE]


def test_one_row_arms_every_endpoint_and_an_endpoint_row_overrides_it() -> None:
    rows = [
        row("endpoint", "*", "value_rate", "enforce", {"multiple": 4.0, "floor_micros": 7}),
        row("endpoint", "*", "retrodating", "enforce", {"window_ms": 2000}),
        row("endpoint", "ep_quiet", "value_rate", "off"),
        row("endpoint", "ep_quiet", "retrodating", "detect", {"window_ms": 9000}),
        row("endpoint", "ep_own", "value_rate", "detect", {"multiple": 2.0}),
    ]
    cfg, states = build_config(rows, GKEY)
    # any endpoint, never configured (a new one): the defaults
    assert cfg.modes("ep_new") == GateModes(ENF, ENF, OFF)
    assert cfg.thresholds("ep_new") == replace(ENDPOINT_ROLLING, multiple=4.0, floor_micros=7)
    assert cfg.window_ms("ep_new") == 2000
    # an endpoint's own rows win, detector by detector, off included
    assert cfg.modes("ep_quiet") == GateModes(DET, OFF, OFF)
    assert cfg.window_ms("ep_quiet") == 9000
    assert cfg.modes("ep_own") == GateModes(ENF, DET, OFF)
    assert cfg.thresholds("ep_own") == replace(ENDPOINT_ROLLING, multiple=2.0)
    # the default row is a setting, never a halt scope
    assert ("endpoint", "*") not in [s.scope for s in states]


def test_arm_all_holds_a_new_endpoints_retrodated_delivery_but_not_an_overridden_one(
) -> None:
    engine = gate(row("endpoint", "*", "retrodating", "enforce"),
                  row("endpoint", "ep_off", "retrodating", "off"))
    out = run(engine, {}, [rec(1, ep="ep_brand_new", **RETRO), rec(2, ep="ep_off", **RETRO)])
    assert [d["endpoint_id"] for d in on(out, "held.v1")] == ["ep_brand_new"]
    assert [d["endpoint_id"] for d in on(out, "dispatch.v1")] == ["ep_off"]


def test_global_rows_count_only_under_the_configured_key() -> None:
    rows = [row("global", "other", "retrodating", "enforce", {"window_ms": 5}, "tripped", 9)]
    cfg, states = build_config(rows, GKEY)
    assert cfg.modes("ep_1") == GateModes()
    assert cfg.window_ms("ep_1") == RETRODATING_WINDOW_MS
    assert states == []
    assert core_scope("global", GKEY, GKEY) == GLOBAL_SCOPE
    assert core_scope("global", "other", GKEY) is None
    assert core_scope("endpoint", "ep_1", GKEY) == EP_SCOPE
    assert core_scope("app", "x", GKEY) is None


def test_a_tripped_row_is_a_halt() -> None:
    engine = gate(row("endpoint", "ep_1", "value_rate", "off", state="tripped", changed=5))
    assert engine.halts.halts == {EP_SCOPE: HaltState.TRIPPED}
    out = run(engine, {}, [rec(0)])
    assert [d["hold_reason"] for d in on(out, "held.v1")] == ["halted_endpoint"]


@pytest.mark.parametrize(("closed_at", "halted"), [(1001, False), (999, True), (1000, True)])
def test_haltbook_latest_change_wins_and_a_tie_is_tripped(closed_at: int, halted: bool) -> None:
    book = HaltBook()
    book.trip_now(Trip("endpoint", "ep_1", Detector.VALUE_RATE, 9, 1.0, T0), 1000)
    assert book.halts == {EP_SCOPE: HaltState.TRIPPED}
    tripped = book.latest(EP_SCOPE, "value_rate")
    assert tripped is not None and tripped.changed_at == 1000
    closed = StateChange(EP_SCOPE, "value_rate", HaltState.CLOSED, closed_at)
    assert book.apply(closed) is not halted
    assert (EP_SCOPE in book.halts) is halted
    assert book.latest(EP_SCOPE, "value_rate") == (tripped if halted else closed)
    assert book.tripped() == ([EP_SCOPE] if halted else [])


def test_haltbook_tie_after_closed_reads_tripped_and_global_trip_maps_to_global() -> None:
    book = HaltBook()
    book.apply(StateChange(GLOBAL_SCOPE, "value_rate", HaltState.CLOSED, 50))
    assert book.halts == {}
    book.trip_now(Trip("global", "*", Detector.VALUE_RATE, 9, 1.0, T0), 50)
    assert book.halts == {GLOBAL_SCOPE: HaltState.TRIPPED}


def test_no_rows_dispatches_everything() -> None:
    out = run(gate(), {}, [rec(0), rec(1, payout_usd_micros=None), rec(2, **RETRO)])
    sent = on(out, "dispatch.v1")
    assert [d["delivery_id"] for d in sent] == ["dlv_ep_1_0", "dlv_ep_1_1", "dlv_ep_1_2"]
    assert all(d["enqueued_at"] == NOW and d["hold_reason"] is None for d in sent)
    assert (out.dispatched, out.held, dict(out.dead), out.trips) == (3, 0, {}, [])


def test_retrodated_under_enforce_is_held_with_an_outcome() -> None:
    store: dict[str, Any] = {}
    out = run(gate(row("global", GKEY, "retrodating", "enforce")), store, [rec(0, **RETRO), rec(1)])
    held = on(out, "held.v1")
    assert [(d["delivery_id"], d["hold_reason"]) for d in held] == [("dlv_ep_1_0", "retrodated")]
    assert held[0]["enqueued_at"] == NOW
    outcomes = on(out, "outcomes.v1", OUTCOME)
    assert [(o["kind"], o["delivery_id"], o["reason"]) for o in outcomes] == [
        ("held", "dlv_ep_1_0", "retrodated")]
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == ["dlv_ep_1_1"]
    again = run(gate(row("global", GKEY, "retrodating", "enforce")), store, [rec(0, **RETRO)])
    assert [d["hold_reason"] for d in on(again, "held.v1")] == ["retrodated"]  # re-processed
    assert [o["kind"] for o in on(again, "outcomes.v1", OUTCOME)] == ["held"]


def test_retrodating_window_from_params() -> None:
    engine = gate(row("endpoint", "ep_1", "retrodating", "enforce", {"window_ms": DAY_MS}))
    two_days: dict[str, Any] = {"source_completed_at": T0 - 2 * DAY_MS, "source_created_at": T0}
    out = run(engine, {}, [rec(0, **two_days), rec(1, ep="ep_2", **two_days)])
    assert [d["endpoint_id"] for d in on(out, "held.v1")] == ["ep_1"]
    assert [d["endpoint_id"] for d in on(out, "dispatch.v1")] == ["ep_2"]


@pytest.mark.parametrize(("mode", "counted"), [("detect", 1.0), ("off", 0.0)])
def test_retrodated_under_detect_or_off_is_dispatched(mode: str, counted: float) -> None:
    before = {m: sample("webhook_retrodated_total", mode=m) for m in ("detect", "off")}
    out = run(gate(row("global", GKEY, "retrodating", mode)), {}, [rec(0, **RETRO)])
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == ["dlv_ep_1_0"]
    assert out.held == 0
    assert sample("webhook_retrodated_total", mode="detect") - before["detect"] == counted
    assert sample("webhook_retrodated_total", mode="off") == before["off"]


def test_missing_payout_under_endpoint_enforce_is_held() -> None:
    engine = gate(row("endpoint", "ep_1", "value_rate", "enforce"))
    out = run(engine, {}, [rec(0, payout_usd_micros=None), rec(1, "ep_2", payout_usd_micros=None)])
    assert [(d["endpoint_id"], d["hold_reason"]) for d in on(out, "held.v1")] == [
        ("ep_1", "missing_anomaly_inputs")]
    assert [d["endpoint_id"] for d in on(out, "dispatch.v1")] == ["ep_2"]


def test_missing_payout_under_detect_is_dispatched_and_counted() -> None:
    before = sample("webhook_missing_anomaly_inputs_total", mode="detect")
    out = run(gate(row("endpoint", "ep_1", "value_rate", "detect")), {},
              [rec(0, payout_usd_micros=None)])
    assert (out.dispatched, out.held) == (1, 0)
    assert sample("webhook_missing_anomaly_inputs_total", mode="detect") == before + 1


def _batch() -> list[In]:
    """Two endpoints on partition 0; offsets 0-4 in hour H, 5-7 in hour H+1."""
    return [rec(o, ep=("ep_1", "ep_2")[o % 2], at=T0 + (o // 5) * HOUR_MS + o * 1000,
                payout_usd_micros=(o + 1) * USD) for o in range(8)]


@pytest.mark.parametrize("crashed_after", [3, 5, 8])
def test_restart_counts_each_payout_once(crashed_after: int) -> None:
    clean, clean_store, store = gate(), dict[str, Any](), dict[str, Any]()
    run(clean, clean_store, _batch())
    run(gate(), store, _batch()[:crashed_after])  # persisted, offsets never committed
    restarted = gate()  # a new process: only the table survives
    new = rec(8, at=T0 + HOUR_MS + 9000, payout_usd_micros=100 * USD)
    out = run(restarted, store, [*_batch(), new])
    run(clean, clean_store, [new])
    for ep in ("ep_1", "ep_2"):  # compared in their stored form (NaN != NaN)
        assert to_dict(restarted.scopes[ep].state) == to_dict(clean.scopes[ep].state)
        assert restarted.scopes[ep].offset == clean.scopes[ep].offset
        back = restore(store[profile_key(ep)], store[ring_key(ep)], store[open_key(ep)])
        assert to_dict(back.state) == to_dict(clean.scopes[ep].state)
    # hour H+1: ep_2 got offsets 5 and 7 (6 + 8 USD); ep_1 offsets 6 and 8 (7 + 100 USD)
    assert (restarted.scopes["ep_2"].state.cur, restarted.scopes["ep_2"].state.h_total) == (
        14 * USD, 14 * USD)
    assert restarted.scopes["ep_1"].state.cur == 107 * USD
    part, off = restarted.partials[0]
    assert (part, off) == clean.partials[0]
    assert (part.window_start, part.total, off) == (T0 + HOUR_MS, 121 * USD, 8)
    assert store["p:0"] == {"w": T0 + HOUR_MS, "t": 121 * USD, "c": 4, "r": 0, "o": 8}
    # every record, re-processed or new, was decided and emitted again
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == [
        f"dlv_{('ep_1', 'ep_2')[o % 2]}_{o}" for o in range(9)]


def test_a_partial_behind_its_endpoints_state_counts_what_it_misses() -> None:
    """kill -9 between the two writes of a flush: the endpoints' state landed, the
    partition's partial did not. The restarted gate counts the missing deliveries in the
    partial (not in the endpoints): the global roll-up gets every payout once."""
    clean, clean_store, store = gate(), dict[str, Any](), dict[str, Any]()
    run(clean, clean_store, _batch())
    run(gate(), store, _batch()[:3])
    behind = store["p:0"]
    run(gate(), store, _batch()[3:])
    store["p:0"] = behind  # its last write was lost
    restarted = gate()
    run(restarted, store, _batch())
    assert restarted.partials[0] == clean.partials[0]
    for ep in ("ep_1", "ep_2"):  # counted once, not again
        assert to_dict(restarted.scopes[ep].state) == to_dict(clean.scopes[ep].state)


def test_unreadable_endpoint_state_starts_afresh_but_the_partial_counts_once() -> None:
    store: dict[str, Any] = {}
    run(gate(), store, _batch())
    store[ring_key("ep_1")] = {"v": 1, "obs": "garbage", "o": 7}
    restarted = gate()
    out = run(restarted, store, _batch())
    assert out.dispatched == 8
    assert restarted.scopes["ep_1"].offset == 6  # re-counted from nothing
    assert store["p:0"] == {"w": T0 + HOUR_MS, "t": 21 * USD, "c": 3, "r": 0, "o": 7}  # once


def test_endpoint_trip_holds_that_endpoint_only() -> None:
    """Three weeks of one $100 delivery an hour, then eight in the first seconds of the
    next hour. The 5-minute span expects 0.11 conversions: its count's noise is taken as
    one conversion's (variance 1), so the sixth scores (6 - 0.11) / 1.0 = 5.9 > k 5 +
    2 / sqrt(5) = 5.89 with the value's score over 2, over 3 x expected and over the $1
    floor: it trips. ep_2 has no history, so no expectation: never a trip."""
    engine = gate(row("endpoint", "ep_1", "value_rate", "enforce",
                      {"multiple": 3.0, "floor_micros": USD, "k": 5.0}))
    store: dict[str, Any] = {}
    weeks = [rec(h, at=T0 + h * HOUR_MS + 60_000, payout_usd_micros=100 * USD)
             for h in range(504)]
    out = run(engine, store, weeks)
    assert (out.dispatched, out.trips) == (504, [])
    burst_at = T0 + 504 * HOUR_MS
    burst: list[In] = []
    for i in range(8):
        burst.append(rec(504 + i, at=burst_at + i * 1000, payout_usd_micros=100 * USD))
        burst.append(rec(i, ep="ep_2", at=burst_at + i * 1000, partition=1,
                         payout_usd_micros=1000 * USD))
    out = run(engine, store, burst)
    [trip] = out.trips
    assert (trip.scope, trip.key, trip.detector, trip.observed) == (
        "endpoint", "ep_1", Detector.VALUE_RATE, 600 * USD)
    assert trip.window_start_ms == burst_at - 4 * 60_000  # the 5-min span, open minute last
    assert trip.baseline == pytest.approx(6.80 * USD, rel=1e-3)
    assert trip.detail is not None and trip.detail.startswith("5-min span (5 min seen)")
    assert "count 6 vs 0.1, score 5.9" in trip.detail
    assert [d["delivery_id"] for d in on(out, "held.v1")] == [
        "dlv_ep_1_509", "dlv_ep_1_510", "dlv_ep_1_511"]
    assert [d["hold_reason"] for d in on(out, "held.v1")] == [
        "payout_rate_endpoint"] + ["halted_endpoint"] * 2
    assert [o["reason"] for o in on(out, "outcomes.v1", OUTCOME)] == [
        "payout_rate_endpoint"] + ["halted_endpoint"] * 2
    sent = on(out, "dispatch.v1")
    assert [d["endpoint_id"] for d in sent].count("ep_2") == 8
    assert [d["delivery_id"] for d in sent if d["endpoint_id"] == "ep_1"] == [
        f"dlv_ep_1_{o}" for o in range(504, 509)]
    assert engine.halts.halts == {EP_SCOPE: HaltState.TRIPPED}
    engine.gauges()  # armed ep_1 exports its spans; ep_2 is not armed
    assert sample("postbacks_anomaly_endpoint_span_observed_usd", endpoint="ep_1",
                  span="5") == 800.0
    assert sample("postbacks_anomaly_endpoint_span_score", endpoint="ep_1", span="5",
                  channel="count") > 7.9
    assert REGISTRY.get_sample_value("postbacks_anomaly_endpoint_span_score",
                                     {"endpoint": "ep_2", "span": "5",
                                      "channel": "value"}) is None

    later = T0 + 506 * HOUR_MS
    out = run(engine, store, [rec(512, at=later, payout_usd_micros=USD),
                              rec(8, ep="ep_2", at=later, partition=1)])
    assert [(d["endpoint_id"], d["hold_reason"]) for d in on(out, "held.v1")] == [
        ("ep_1", "halted_endpoint")]
    assert [d["endpoint_id"] for d in on(out, "dispatch.v1")] == ["ep_2"]
    assert out.trips == []

    tripped_at = engine.halts.latest(EP_SCOPE, "value_rate")
    assert tripped_at is not None and tripped_at.state is HaltState.TRIPPED
    engine.halts.apply(StateChange(EP_SCOPE, "value_rate", HaltState.CLOSED, NOW + 1))
    out = run(engine, store, [rec(513, at=later + 1, payout_usd_micros=USD)])
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == ["dlv_ep_1_513"]
    # disarmed: its series go at the next export
    engine.config = build_config([], GKEY)[0]
    engine.gauges()
    assert REGISTRY.get_sample_value("postbacks_anomaly_endpoint_span_score",
                                     {"endpoint": "ep_1", "span": "5",
                                      "channel": "value"}) is None


def test_a_closed_endpoint_judges_from_the_minute_after_and_a_restart_keeps_that() -> None:
    """Closed right after its trip, ep_1 does not trip again on the burst still inside its
    spans: deliveries in the same minute are dispatched. From the next minute on its spans
    are partial windows starting there (1 minute seen: k 5 + 2 / sqrt(1) = 7 for the
    count), and a restarted gate keeps that: one delivery does not trip, eight do."""
    engine = gate(row("endpoint", "ep_1", "value_rate", "enforce",
                      {"multiple": 3.0, "floor_micros": USD, "k": 5.0}))
    store: dict[str, Any] = {}
    run(engine, store, [rec(h, at=T0 + h * HOUR_MS + 60_000, payout_usd_micros=100 * USD)
                        for h in range(504)])
    burst_at = T0 + 504 * HOUR_MS
    out = run(engine, store, [rec(504 + i, at=burst_at + i * 1000, payout_usd_micros=100 * USD)
                              for i in range(6)])
    assert len(out.trips) == 1
    engine.halts.apply(StateChange(EP_SCOPE, "value_rate", HaltState.CLOSED, NOW + 1))
    out = run(engine, store, [rec(510 + i, at=burst_at + 10_000 + i * 1000,
                                  payout_usd_micros=100 * USD) for i in range(3)])
    assert (out.dispatched, out.held, out.trips) == (3, 0, [])
    assert engine.scopes["ep_1"].since == burst_at // 60_000 + 1

    restarted = gate(row("endpoint", "ep_1", "value_rate", "enforce",
                         {"multiple": 3.0, "floor_micros": USD, "k": 5.0}))
    restarted.halts.apply(StateChange(EP_SCOPE, "value_rate", HaltState.CLOSED, NOW + 1))
    nxt = burst_at + 60_000
    out = run(restarted, store, [rec(513, at=nxt + 1000, payout_usd_micros=100 * USD)])
    assert (out.dispatched, out.trips) == (1, [])
    assert restarted.scopes["ep_1"].since == burst_at // 60_000 + 1
    out = run(restarted, store, [rec(514 + i, at=nxt + 2000 + i * 1000,
                                     payout_usd_micros=100 * USD) for i in range(8)],
              now=NOW + 10)  # after the close
    [trip] = out.trips
    assert (out.dispatched, out.held) == (6, 2)  # the 8th in the minute trips
    assert trip.window_start_ms == nxt and trip.detail is not None
    assert trip.detail.startswith("5-min span (1 min seen)")


def test_undecodable_records_go_to_the_dlq_and_the_batch_goes_on() -> None:
    batch = [In("deliveries.v1", 2, 10, b"k1", b"\xc3\x01garbage!"),
             In("deliveries.v1", 2, 11, b"k2", None), rec(12, partition=2)]
    out = run(gate(), {}, batch)
    dead = on(out, "dlq.v1", DLQ)
    assert [(d["reason"], d["origin_offset"], d["original_value"], d["original_key"])
            for d in dead] == [("undecodable", 10, b"\xc3\x01garbage!", b"k1"),
                               ("undecodable", 11, None, b"k2")]
    assert all(d["stage"] == "gate" and d["origin_partition"] == 2 for d in dead)
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == ["dlv_ep_1_12"]
    assert (dict(out.dead), out.dispatched) == ({"undecodable": 2}, 1)


def test_an_undecodable_record_near_the_broker_limit_gets_a_dead_letter_that_fits() -> None:
    """The broker takes up to 1,048,588 bytes from another producer; the gate's producer
    sends at most 1,000,000 (a dead letter over it aborted the gate's batch for ever)."""
    big = b"\xc3" + bytes(1_040_000)
    out = run(gate(), {}, [In("deliveries.v1", 0, 5, b"k" * 3000, big), rec(6)])
    [(_, key, value)] = [r for r in out.records if r[0] == "dlq.v1"]
    assert len(key or b"") + len(value) <= 1_000_000 - 512
    dl = DLQ.decode(value)
    assert key == dl["original_key"] == b"k" * 1024
    assert big.startswith(dl["original_value"]) and len(dl["original_value"]) > 990_000
    assert dl["error_message"].startswith("original bytes cut to fit a dead letter")
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == ["dlv_ep_1_6"]


def test_partials_are_throttled_but_a_closed_window_and_the_commit_get_theirs() -> None:
    """Partials are cumulative: skipping intermediate ones loses nothing, the final partial
    of a window is sent at once, and ``take_partials`` (before every commit) sends the rest."""
    engine = GateEngine(build_config((), GKEY)[0], HaltBook(), partials_interval_ms=250)
    store: dict[str, Any] = {}
    batch = _batch()  # partition 0: offsets 0-4 in hour H, 5-7 in hour H+1
    first = run(engine, store, batch[:2], now=NOW)  # the first batch: the interval has passed
    assert [(p, part.total, off) for p, part, off in first.partials] == [(0, 3 * USD, 1)]
    quiet = run(engine, store, batch[2:4], now=NOW + 100)  # within 250 ms: held back
    assert quiet.partials == []
    closing = run(engine, store, batch[4:6], now=NOW + 200)  # hour H closes mid-batch
    assert [(part.window_start, part.total, off) for _, part, off in closing.partials] == [
        (T0, 15 * USD, 4)]  # hour H's final partial, everything of offsets 0-4
    assert [(part.window_start, part.total, off) for _, part, off in
            engine.take_partials(NOW + 210)] == [(T0 + HOUR_MS, 6 * USD, 5)]
    assert engine.take_partials(NOW + 220) == []  # nothing moved since
    later = run(engine, store, batch[6:], now=NOW + 500)  # the interval has passed again
    assert [(part.total, off) for _, part, off in later.partials] == [(21 * USD, 7)]


def test_every_batch_sends_its_partials_with_no_interval() -> None:
    engine = gate()  # partials_interval_ms=0
    store: dict[str, Any] = {}
    sent = [len(run(engine, store, [r], now=NOW).partials) for r in _batch()[:4]]
    assert sent == [1, 1, 1, 1]


def test_a_record_handed_over_again_is_not_decided_twice_until_a_rebalance() -> None:
    engine, store = gate(), dict[str, Any]()
    batch = _batch()
    first = run(engine, store, batch[:4])
    assert len(on(first, "dispatch.v1")) == 4
    again = run(engine, store, batch[3:6])  # offset 3 again, as Faust does after a pause
    assert again.redelivered == 1
    assert [d["delivery_id"] for d in on(again, "dispatch.v1")] == ["dlv_ep_1_4", "dlv_ep_2_5"]
    before = sample("postbacks_gate_deliveries_total", decision="redelivered_skipped")
    run(engine, store, batch[5:6])
    assert sample("postbacks_gate_deliveries_total", decision="redelivered_skipped") == before + 1
    engine.forget()  # a rebalance: the committed offsets decide what is read again
    after = run(engine, store, batch[2:4])
    assert after.redelivered == 0 and len(on(after, "dispatch.v1")) == 2


def test_a_partition_sought_back_below_its_decided_run_is_decided_again() -> None:
    """A record handed over out of order (fetched before a seek, say) must not make the
    engine skip the records below it that it never saw."""
    engine, store = gate(), dict[str, Any]()
    batch = _batch()
    ahead = run(engine, store, batch[5:6])  # offset 5 first
    assert len(on(ahead, "dispatch.v1")) == 1
    back = run(engine, store, batch[:6])  # then from offset 0: a new run
    assert back.redelivered == 0  # 0-4 never seen; 5 decided again (a duplicate at worst)
    assert [d["delivery_id"] for d in on(back, "dispatch.v1")] == [
        d["delivery_id"] for d in on(run(gate(), {}, batch[:6]), "dispatch.v1")]
    again = run(engine, store, batch[2:4])  # inside the run now: skipped
    assert again.redelivered == 2


# (field name in the held reason, the conversion's values) for inputs the gate cannot count
_UNCOUNTABLE = [
    ("payout_usd_micros (unparseable)", {"payout_usd_micros": 2**63 - 1}),
    ("payout_usd_micros (unparseable)", {"payout_usd_micros": 10**12 + 1}),
    ("occurred_at (unparseable)", {"at": NOW + MAX_AHEAD_MS + 1}),  # a wrong clock
    ("occurred_at (unparseable)", {"at": 1_700_000_000}),  # epoch seconds
    ("payout_usd_micros (missing), occurred_at (unparseable)",
     {"payout_usd_micros": None, "at": 2**62}),
]


@pytest.mark.parametrize(("named", "conv"), _UNCOUNTABLE)
@pytest.mark.parametrize("scope", ["endpoint", "global"])
def test_an_uncountable_payout_is_held_under_enforce_naming_the_field(
        named: str, conv: dict[str, Any], scope: str) -> None:
    """Not counted in the endpoint's state nor the partition's partial (an overflowing
    sum, or a window moved into the future, used to stop the gate or skew every later
    payout), and held under either scope's enforce, the field named."""
    key = "ep_1" if scope == "endpoint" else GKEY
    engine = gate(row(scope, key, "value_rate", "enforce"))
    store: dict[str, Any] = {}
    out = run(engine, store, [rec(0), rec(1, **conv), rec(2)])
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == ["dlv_ep_1_0", "dlv_ep_1_2"]
    assert [(d["delivery_id"], d["hold_reason"]) for d in on(out, "held.v1")] == [
        ("dlv_ep_1_1", "missing_anomaly_inputs")]
    assert [o["reason"] for o in on(out, "outcomes.v1", OUTCOME)] == [
        f"missing_anomaly_inputs: {named}"]
    part, _ = engine.partials[0]
    assert (part.window_start, part.total, part.count) == (
        T0, 2 * make_conversion()["payout_usd_micros"], 2)


def test_an_uncountable_payout_under_detect_is_sent_and_counted() -> None:
    before = sample("webhook_missing_anomaly_inputs_total", mode="detect")
    out = run(gate(row("global", GKEY, "value_rate", "detect")), {},
              [rec(0, at=NOW + 2 * HOUR_MS)])
    assert (out.dispatched, out.held) == (1, 0)
    assert sample("webhook_missing_anomaly_inputs_total", mode="detect") == before + 1


def test_the_edges_of_a_countable_payout_are_counted() -> None:
    engine = gate(row("global", GKEY, "value_rate", "enforce"))
    out = run(engine, {}, [rec(0, at=NOW + MAX_AHEAD_MS, payout_usd_micros=10**12),
                           rec(1, at=MIN_OCCURRED_AT_MS, payout_usd_micros=0, partition=1)])
    assert (out.dispatched, out.held) == (2, 0)
    assert engine.partials[0][0].total == 10**12


@pytest.mark.parametrize("rows", [(), (row("endpoint", "ep_1", "retrodating", "off"),)])
def test_the_partial_counts_retrodated_deliveries_whatever_the_mode(
        rows: tuple[AnomalyRow, ...]) -> None:
    """The aggregator's retrodated burst needs the count of every partition's minute, armed
    or not (as payouts are counted before a value rate is armed)."""
    engine = gate(*rows)
    out = run(engine, {}, [rec(0, **RETRO), rec(1), rec(2, **RETRO),
                           rec(3, source_completed_at=T0 - 7 * DAY_MS, source_created_at=T0)])
    part, off = engine.partials[0]
    assert (part.count, part.retro, off) == (4, 2, 3)  # exactly 7 days is not retrodated
    assert [(p, sent.retro) for p, sent, _ in out.partials] == [(0, 2)]  # what goes out


def test_a_delivery_off_its_endpoints_partition_is_dead_lettered_and_counts_nothing() -> None:
    """One delivery of ep_1 with another key, or on a partition its key does not go to
    (another producer's partitioner), used to move ep_1's counted offset to a number from
    another log: none of ep_1's own deliveries below it was counted again, so a burst went
    through an enforcing detector. It is dead-lettered, named, and ep_1 is still judged."""
    from streams.anomaly_gate.placement import home_partition

    n = 12
    home = home_partition(b"ep_1", n)
    other = (home + 1) % n
    rows = (row("endpoint", "ep_1", "value_rate", "enforce"),)
    engines = {"clean": GateEngine(*build_config(rows, GKEY)[:1], HaltBook(), partitions=n),
               "strays": GateEngine(*build_config(rows, GKEY)[:1], HaltBook(), partitions=n)}
    history = [rec(i, at=T0 - 21 * 1440 * 60_000 + i * 3_600_000, partition=home,
                   payout_usd_micros=USD) for i in range(504)]  # three weeks, one an hour
    burst = [rec(1000 + i, at=T0 + 60_000 + i * 1000, partition=home,
                 payout_usd_micros=100 * USD) for i in range(50)]
    wrong_key = dataclasses.replace(rec(504, partition=home), key=b"ep_2")
    wrong_part = rec(5_000_001, partition=other)
    outs = {}
    for name, engine in engines.items():
        store: dict[str, Any] = {}
        run(engine, store, history, now=T0)
        strays = [wrong_key, wrong_part] if name == "strays" else []
        outs[name] = run(engine, store, strays + burst, now=T0 + 120_000)
    clean, strayed = outs["clean"], outs["strays"]
    assert clean.held > 0  # the burst trips ep_1's detector
    assert (strayed.held, strayed.dispatched) == (clean.held, clean.dispatched)
    assert dict(strayed.dead) == {"invalid_record": 2}
    why = [d["error_message"] for d in on(strayed, "dlq.v1", DLQ)]
    assert "with key b'ep_2'" in why[0] and "keyed by its endpoint_id" in why[0]
    assert f"on partition {other}, where its key belongs on {home} of {n}" in why[1]


def test_a_delivery_the_gate_could_not_pass_on_is_dead_lettered_too_large() -> None:
    """A valid delivery near the broker's limit (another producer's) made the gate's own
    produce fail, and it restarted on it for ever: it is dead-lettered ``too_large``."""
    big = rec(7, source_snapshot={"blob": "x" * 999_000})
    out = run(gate(), {}, [big, rec(8)])
    [dl] = on(out, "dlq.v1", DLQ)
    assert dl["reason"] == "too_large" and "the gate passes on at most" in dl["error_message"]
    assert [d["delivery_id"] for d in on(out, "dispatch.v1")] == ["dlv_ep_1_8"]
    assert dict(out.dead) == {"too_large": 1}


def test_a_delivery_dated_ahead_is_counted_no_later_than_a_minute_after_its_writing() -> None:
    """One delivery dated 59 minutes ahead (a producer's CET clock labelled Z) moved its
    endpoint's and partition's windows 59 minutes into the future: every later delivery was
    counted into that minute, blinding the scope, then tripping it on normal traffic."""
    engine = gate(row("endpoint", "ep_1", "value_rate", "detect"))
    store: dict[str, Any] = {}
    ahead = dataclasses.replace(rec(0, at=NOW + 59 * 60_000), written_ms=NOW - 5_000)
    run(engine, store, [ahead, rec(1, at=NOW - 1_000)])
    minute = engine.scopes["ep_1"].state.minute
    assert minute is not None and minute * 60_000 <= NOW + 60_000, minute * 60_000 - NOW
    part, _offset = engine.partials[0]
    assert part.window_start is not None and part.window_start <= NOW + 60_000
    # read again from the same records (their timestamps): the same minute
    again = gate(row("endpoint", "ep_1", "value_rate", "detect"))
    run(again, {}, [ahead], now=NOW + 3_600_000)
    assert again.scopes["ep_1"].state.minute == (NOW - 5_000 + 60_000) // 60_000
