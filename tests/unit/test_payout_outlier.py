"""The single-payout check: one payout far above the largest the endpoint was paid in the
last four weeks is held (payout_outlier) under the endpoint's value-rate enforce, counted
under detect, and never raises the peak it is judged by."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from postbacks.codec import codec_for
from postbacks.core.anomaly.endpoint_state import ENDPOINT_POLICY, EndpointState, dump, restore
from postbacks.core.anomaly.outlier import (
    MIN_PAYOUTS,
    NO_PEAKS,
    WEEK_MS,
    Peaks,
    judge,
    note,
    peaks_from,
    to_json,
    verdict,
    with_verdict,
)
from postbacks.core.anomaly.rolling import add, empty
from postbacks.db.anomaly import AnomalyRow, validate_params
from streams.anomaly_gate.config import HaltBook, build_config
from streams.anomaly_gate.engine import BatchOut, GateEngine, In
from tests.unit.factories import make_conversion, make_delivery

USD = 1_000_000
HOUR = 3_600_000
W0 = 2_800 * WEEK_MS  # a week boundary
NOW = W0 + 3 * WEEK_MS + 10 * HOUR
DELIVERY, OUTCOME = codec_for("Delivery"), codec_for("Outcome")


def _paid(p: Peaks, at: int, micros: int, times: int = MIN_PAYOUTS) -> Peaks:
    for i in range(times):
        p = note(p, at + i, micros)
    return p


def test_no_judgement_until_the_history_is_two_weeks_long_with_ten_payouts() -> None:
    p = _paid(NO_PEAKS, W0 + WEEK_MS + 5, 40 * USD)  # first seen in week 1
    assert judge(p, W0 + 2 * WEEK_MS + 5, 5_000 * USD, 5.0, 200 * USD) is None
    late = note(p, W0 + 5, 40 * USD)  # dated in week 0: counted in week 1, as sent
    assert late.since == p.since and late.weeks == p.weeks
    assert judge(late, W0 + 2 * WEEK_MS + 5, 5_000 * USD, 5.0, 200 * USD) is None
    assert judge(p, W0 + 3 * WEEK_MS + 5, 5_000 * USD, 5.0, 200 * USD) == 40 * USD
    thin = _paid(NO_PEAKS, W0, 40 * USD, MIN_PAYOUTS - 1)
    assert judge(thin, W0 + 3 * WEEK_MS, 5_000 * USD, 5.0, 200 * USD) is None
    assert note(thin, W0, 0) == thin  # a payout of 0 counts nothing


def test_both_the_multiple_and_the_floor_must_be_exceeded() -> None:
    p = note(_paid(NO_PEAKS, W0, 10 * USD), W0 + WEEK_MS, 40 * USD)
    at = W0 + 2 * WEEK_MS + HOUR
    assert judge(p, at, 240 * USD, 5.0, 200 * USD) is None  # over the floor, not 5 x
    assert judge(p, at, 240_000_001, 5.0, 200 * USD) == 40 * USD  # both: over $240
    assert judge(p, at, 240_000_001, 5.0, 300 * USD) is None  # not over the floor
    assert judge(p, at, 10_000 * USD, 0.0, 200 * USD) is None  # multiple 0: off


def test_the_peak_is_the_largest_of_the_last_four_weeks() -> None:
    p = _paid(NO_PEAKS, W0, 900 * USD)  # a big one, long ago
    for week in range(1, 6):
        p = note(p, W0 + week * WEEK_MS, 20 * USD)
    at = W0 + 5 * WEEK_MS + HOUR
    assert judge(p, at, 500 * USD, 5.0, 200 * USD) == 20 * USD  # the $900 aged out
    assert [w for w, _m in p.weeks] == [2801, 2802, 2803, 2804, 2805]  # 4 completed + now
    assert note(p, W0, 1).weeks == p.weeks  # late, before every kept week


def test_this_weeks_payouts_raise_the_peak_only_once_the_week_is_over() -> None:
    """A ladder of payouts each just under 5 x the last one sent walked the peak from
    $40 to $999,999 in seven payouts: within a week, each is judged against the weeks
    before."""
    p = _paid(NO_PEAKS, W0, 40 * USD)
    p = _paid(p, W0 + WEEK_MS, 40 * USD)
    at = W0 + 2 * WEEK_MS + HOUR
    held = []
    for step in (240, 1_200, 6_000, 30_000, 150_000, 750_000, 999_999):
        peak = judge(p, at, step * USD, 5.0, 200 * USD)
        held.append(step if peak is not None else None)
        if peak is None:
            p = note(p, at, step * USD)  # only a payout sent raises the peak
        at += 2 * HOUR
    assert held == [None, 1_200, 6_000, 30_000, 150_000, 750_000, 999_999]
    # next week the $240 sent is the peak: $1,200 is 5 x it, not over it
    assert judge(p, W0 + 3 * WEEK_MS, 1_200 * USD, 5.0, 200 * USD) is None


@pytest.mark.parametrize("dated", [W0 - 800 * WEEK_MS, W0 + WEEK_MS, 1])
def test_a_payout_dated_back_is_judged_and_counted_as_of_the_newest_week(dated: int) -> None:
    """Dated years back (or by a record timestamp of 1 ms), a $999,999 payout was judged
    against no history and sent; dated last week, it raised a peak already in use."""
    p = _paid(_paid(_paid(NO_PEAKS, W0, 40 * USD), W0 + WEEK_MS, 40 * USD),
              W0 + 2 * WEEK_MS, 40 * USD)
    assert judge(p, dated, 999_999 * USD, 5.0, 200 * USD) == 40 * USD
    sent = note(p, dated, 150 * USD)  # not an outlier: counted in the newest week
    assert sent.since == p.since and dict(sent.weeks)[2802] == 150 * USD
    assert judge(sent, W0 + 2 * WEEK_MS + HOUR, 700 * USD, 5.0, 200 * USD) == 40 * USD


def test_an_endpoint_back_after_a_silence_is_judged_as_a_new_one() -> None:
    p = _paid(NO_PEAKS, W0, 20 * USD)
    quiet = W0 + 12 * WEEK_MS  # nothing paid in the last four weeks: no peak to judge by
    assert judge(p, quiet, 500 * USD, 5.0, 200 * USD) is None
    back = note(p, quiet, 20 * USD)  # a test payout: the history starts again
    assert (back.since, back.n) == (quiet // WEEK_MS, 1)
    assert judge(back, quiet + HOUR, 500 * USD, 5.0, 200 * USD) is None


def test_verdicts_are_kept_for_a_delivery_read_again() -> None:
    p = NO_PEAKS
    for offset in range(40):
        p = with_verdict(p, offset, 7)
    assert verdict(p, 39) == 7 and verdict(p, 8) == 7 and verdict(p, 7) is None  # 32 kept
    assert verdict(NO_PEAKS, 3) is None


def test_peaks_round_trip_and_a_malformed_one_is_dropped_alone() -> None:
    p = with_verdict(note(_paid(NO_PEAKS, W0, 10 * USD), W0 + WEEK_MS, 30 * USD), 12, 30)
    assert peaks_from(json.loads(json.dumps(to_json(p)))) == p
    assert peaks_from(None) == NO_PEAKS
    for bad in ([1], "x", [1, [[1, -5]], 3, []], [1, [["w", 5]], 3, []], [1, [], -1, []]):
        with pytest.raises(ValueError):
            peaks_from(bad)
    t = EndpointState(add(empty(ENDPOINT_POLICY), W0 + WEEK_MS, 30 * USD), 7, peaks=p)
    profile, ring, open_, _ = dump(t)
    assert ring is not None
    assert restore(profile, ring, open_).peaks == p
    assert restore(profile, ring, None).peaks == p  # the ring carries them too
    assert restore(profile, {**ring, "pk": None}, {**open_, "pk": None}).peaks == NO_PEAKS
    broken = restore(profile, ring, {**open_, "pk": [1, 2]})  # only the peaks start afresh
    assert broken.peaks == NO_PEAKS and broken.state.minute == t.state.minute


def test_single_multiple_is_a_value_rate_param() -> None:
    assert validate_params("value_rate", {"single_multiple": 0}) == {"single_multiple": 0.0}
    assert validate_params("value_rate", {"single_multiple": 8}) == {"single_multiple": 8.0}
    for bad in (0.5, -1, float("nan")):
        with pytest.raises(ValueError, match="single_multiple"):
            validate_params("value_rate", {"single_multiple": bad})
    with pytest.raises(ValueError, match="configures value_rate"):
        validate_params("retrodating", {"single_multiple": 3})


def _gate(mode: str, retro: str = "off", **params: Any) -> GateEngine:
    cfg, _ = build_config([AnomalyRow("endpoint", "ep_1", "value_rate", mode, params,
                                      "closed", None, None),
                           AnomalyRow("endpoint", "ep_1", "retrodating", retro, {},
                                      "closed", None, None)], "g")
    return GateEngine(cfg, HaltBook())


def _rec(offset: int, at: int, micros: int, age_ms: int = 1000) -> In:
    conv = make_conversion(event_id=f"evt_{offset}", occurred_at=at,
                           payout_usd_micros=micros, source_created_at=at,
                           source_completed_at=at - age_ms)
    d = make_delivery(delivery_id=f"dlv_{offset}", endpoint_id="ep_1", conversion=conv)
    return In("deliveries.v1", 0, offset, b"ep_1", DELIVERY.encode(d))


def _history(g: GateEngine, store: dict[str, Any]) -> int:
    """Three weeks of $10 to $40 an hour: the peak is $40."""
    batch = [_rec(i, W0 + i * HOUR, (10 + 10 * (i % 4)) * USD) for i in range(3 * 168)]
    _run(g, store, batch)
    return len(batch)


def _run(g: GateEngine, store: dict[str, Any], batch: list[In]) -> BatchOut:
    out = g.process(batch, store.get, NOW)
    for _, k, v in g.take_writes():
        store[k] = json.loads(json.dumps(v))
    return out


def _held(out: BatchOut) -> list[tuple[str, str]]:
    return [(o["delivery_id"], o["reason"]) for o in
            (OUTCOME.decode(v) for t, _k, v in out.records if t == "outcomes.v1")
            if o["kind"] == "held"]


def test_enforce_holds_an_outlier_alone_and_keeps_holding_the_next_one() -> None:
    g, store = _gate("enforce"), {}
    n = _history(g, store)
    at = W0 + 3 * WEEK_MS + HOUR
    out = _run(g, store, [_rec(n, at, 5_000 * USD), _rec(n + 1, at + 1, 30 * USD)])
    assert _held(out) == [
        (f"dlv_{n}", "payout_outlier: USD 5,000.00 over 5 x the endpoint's 4-week peak of "
                     "USD 40.00")]
    assert [d["hold_reason"] for t, _k, v in out.records if t == "held.v1"
            for d in [DELIVERY.decode(v)]] == ["payout_outlier"]
    assert out.dispatched == 1 and not out.trips  # one payout halts nothing
    # a second one an hour later: judged against the same peak (the first did not raise it)
    out = _run(g, store, [_rec(n + 2, at + HOUR, 4_000 * USD)])
    assert [r for _d, r in _held(out)] == [
        "payout_outlier: USD 4,000.00 over 5 x the endpoint's 4-week peak of USD 40.00"]
    # after a restart (a cache flush), the table's peaks judge the same way
    g.forget()
    out = _run(g, store, [_rec(n + 3, at + 2 * HOUR, 4_000 * USD)])
    assert [r for _d, r in _held(out)] == [
        "payout_outlier: USD 4,000.00 over 5 x the endpoint's 4-week peak of USD 40.00"]


def test_detect_counts_and_delivers_and_the_check_can_be_turned_off() -> None:
    def signals() -> float:
        return REGISTRY.get_sample_value("postbacks_anomaly_signals_total",
                                         {"reason": "payout_outlier", "mode": "detect"}) or 0.0

    g, store = _gate("detect"), {}
    n = _history(g, store)
    before = signals()
    out = _run(g, store, [_rec(n, W0 + 3 * WEEK_MS + HOUR, 5_000 * USD)])
    assert _held(out) == [] and out.dispatched == 1
    assert signals() == before + 1

    g, store = _gate("enforce", single_multiple=0), {}
    n = _history(g, store)
    out = _run(g, store, [_rec(n, W0 + 3 * WEEK_MS + HOUR, 5_000 * USD)])
    assert _held(out) == []


def test_peaks_are_kept_exactly_once_a_replayed_outlier_does_not_raise_them() -> None:
    g, store = _gate("enforce"), {}
    n = _history(g, store)
    at = W0 + 3 * WEEK_MS + HOUR
    _run(g, store, [_rec(n, at, 5_000 * USD)])
    g.forget()
    out = _run(g, store, [_rec(n, at, 5_000 * USD)])  # read again after a crash
    assert [d for d, _r in _held(out)] == [f"dlv_{n}"]
    assert isinstance(g.scopes["ep_1"].peaks, Peaks)
    assert max(m for _w, m in g.scopes["ep_1"].peaks.weeks) == 40 * USD


def test_a_delivery_read_again_after_a_crash_keeps_its_first_verdict() -> None:
    g, store = _gate("enforce"), {}
    n = _history(g, store)
    at = W0 + 3 * WEEK_MS + HOUR
    # $600 is an outlier against the $40 peak; $150 after it is not, and raises the peak
    batch = [_rec(n, at, 600 * USD), _rec(n + 1, at + 1, 150 * USD)]
    assert [d for d, _r in _held(_run(g, store, batch))] == [f"dlv_{n}"]
    g.forget()  # a crash before the commit: both are read again, their state already on
    out = _run(g, store, batch)  # the table (against a $150 peak, $600 would pass)
    assert [d for d, _r in _held(out)] == [f"dlv_{n}"] and out.dispatched == 1


def test_a_payout_held_for_another_reason_does_not_raise_the_peak() -> None:
    g, store = _gate("enforce", retro="enforce"), {}
    n = _history(g, store)
    at = W0 + 3 * WEEK_MS + HOUR
    out = _run(g, store, [_rec(n, at, 150 * USD, age_ms=30 * 86_400_000)])  # retrodated
    assert [r for _d, r in _held(out)] == ["retrodated"]
    out = _run(g, store, [_rec(n + 1, at + HOUR, 600 * USD)])  # still against $40
    assert [r.split(":")[0] for _d, r in _held(out)] == ["payout_outlier"]
