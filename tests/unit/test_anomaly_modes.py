"""The gate decision: modes per detector and scope, missing inputs, halts, trips."""

from __future__ import annotations

import pytest

from postbacks.core.anomaly.detectors import (
    MISSING_PAYOUT,
    NO_BASELINE,
    WITHIN,
    MissingInputs,
    Over,
    RateResult,
)
from postbacks.core.anomaly.modes import (
    DELIVER,
    GLOBAL_SCOPE,
    Deliver,
    Detector,
    GateModes,
    HaltState,
    Hold,
    HoldReason,
    Mode,
    Scope,
    Signal,
    Trip,
    apply_trips,
    decide,
    endpoint_scope,
    resolve_modes,
)

OFF, DET, ENF = Mode.OFF, Mode.DETECT, Mode.ENFORCE
R = HoldReason
EP = "ep_1"
NO_TS = MissingInputs(("source_created_at",))
OVER = Over(0, 900, 100.0)


def _modes(retro: Mode = OFF, ep: Mode = OFF, gl: Mode = OFF) -> GateModes:
    return GateModes(retro, ep, gl)


@pytest.mark.parametrize(("mode", "expected"), [
    (OFF, DELIVER),
    (DET, Deliver((Signal(R.RETRODATED, DET),))),
    (ENF, Hold(R.RETRODATED, (Signal(R.RETRODATED, ENF),))),
])
def test_retrodated_per_mode(mode: Mode, expected: Deliver | Hold) -> None:
    assert decide(EP, _modes(retro=mode), True, WITHIN) == expected


@pytest.mark.parametrize(("mode", "expected"), [
    (OFF, DELIVER),
    (DET, Deliver((Signal(R.MISSING_ANOMALY_INPUTS, DET),))),
    (ENF, Hold(R.MISSING_ANOMALY_INPUTS, (Signal(R.MISSING_ANOMALY_INPUTS, ENF),),
               detail="source_created_at (missing)")),
])
def test_missing_timestamps_per_mode(mode: Mode, expected: Deliver | Hold) -> None:
    assert decide(EP, _modes(retro=mode), NO_TS, WITHIN) == expected


def test_a_hold_on_inputs_names_each_field_and_why() -> None:
    from postbacks.core.anomaly.detectors import payout_input, retrodated

    d = decide(EP, _modes(retro=ENF, ep=ENF), retrodated("2026-03-01T12:00", None),
               payout_input("lots"))
    assert isinstance(d, Hold) and d.reason is R.MISSING_ANOMALY_INPUTS
    assert d.describe() == ("missing_anomaly_inputs: source_created_at (unparseable), "
                            "source_completed_at (missing); payout_usd_micros (unparseable)")
    assert Hold(R.RETRODATED).describe() == "retrodated"


@pytest.mark.parametrize(("modes", "held"), [
    (_modes(ep=OFF, gl=OFF), None),
    (_modes(ep=DET, gl=OFF), False),
    (_modes(ep=OFF, gl=DET), False),
    (_modes(ep=DET, gl=DET), False),
    (_modes(ep=ENF, gl=OFF), True),
    (_modes(ep=DET, gl=ENF), True),
    (_modes(retro=ENF), None),  # payout is not the retrodating guard's input
])
def test_missing_payout_per_mode(modes: GateModes, held: bool | None) -> None:
    d = decide(EP, modes, False, MISSING_PAYOUT, MISSING_PAYOUT)
    match d:
        case Hold(reason=reason):
            assert held is True and reason is R.MISSING_ANOMALY_INPUTS
        case Deliver(metrics=metrics):
            assert held is not True
            assert (metrics == (Signal(R.MISSING_ANOMALY_INPUTS, DET),)) is (held is False)


@pytest.mark.parametrize(("mode", "kind"), [(OFF, "deliver"), (DET, "signal"), (ENF, "hold")])
def test_endpoint_rate_per_mode(mode: Mode, kind: str) -> None:
    d = decide(EP, _modes(ep=mode), False, OVER)
    if kind == "deliver":
        assert d is DELIVER
    elif kind == "signal":
        assert d == Deliver((Signal(R.PAYOUT_RATE_ENDPOINT, DET),))
    else:
        assert d == Hold(R.PAYOUT_RATE_ENDPOINT, (Signal(R.PAYOUT_RATE_ENDPOINT, ENF),),
                         (Trip("endpoint", EP, Detector.VALUE_RATE, 900, 100.0, 0),))


def test_global_rate_trip_under_enforce() -> None:
    d = decide(EP, _modes(gl=ENF), False, WITHIN, OVER)
    assert d == Hold(R.PAYOUT_RATE_GLOBAL, (Signal(R.PAYOUT_RATE_GLOBAL, ENF),),
                     (Trip("global", "*", Detector.VALUE_RATE, 900, 100.0, 0),))


@pytest.mark.parametrize("rate", [WITHIN, NO_BASELINE])
def test_nothing_fired_delivers_without_metrics(rate: RateResult) -> None:
    assert decide(EP, _modes(ENF, ENF, ENF), False, rate, rate) is DELIVER


@pytest.mark.parametrize(("halts", "reason"), [
    ({GLOBAL_SCOPE: HaltState.TRIPPED}, R.HALTED_GLOBAL),
    ({endpoint_scope(EP): HaltState.TRIPPED}, R.HALTED_ENDPOINT),
    ({GLOBAL_SCOPE: HaltState.TRIPPED, endpoint_scope(EP): HaltState.TRIPPED}, R.HALTED_GLOBAL),
    ({endpoint_scope("ep_other"): HaltState.TRIPPED}, None),
    ({GLOBAL_SCOPE: HaltState.CLOSED}, None),
])
@pytest.mark.parametrize("modes", [_modes(), _modes(DET, DET, DET), _modes(ENF, ENF, ENF)])
def test_halts_hold_everything_in_scope_whatever_the_mode(
    halts: dict[Scope, HaltState], reason: HoldReason | None, modes: GateModes
) -> None:
    d = decide(EP, modes, False, WITHIN, WITHIN, halts)
    assert d == (DELIVER if reason is None else Hold(reason))


def test_an_already_tripped_scope_does_not_trip_again() -> None:
    halts = {endpoint_scope(EP): HaltState.TRIPPED}
    d = decide(EP, _modes(ep=ENF), False, OVER, None, halts)
    assert d == Hold(R.HALTED_ENDPOINT, (Signal(R.PAYOUT_RATE_ENDPOINT, ENF),), ())


def test_reason_priority_and_every_signal_reported() -> None:
    d = decide(EP, _modes(ENF, ENF, ENF), True, OVER, OVER)
    assert isinstance(d, Hold)
    assert d.reason is R.RETRODATED
    assert [s.reason for s in d.metrics] == [R.RETRODATED, R.PAYOUT_RATE_GLOBAL,
                                             R.PAYOUT_RATE_ENDPOINT]
    assert [t.scope for t in d.trips] == ["global", "endpoint"]


def test_detect_never_diverts() -> None:
    d = decide(EP, _modes(DET, DET, DET), True, OVER, OVER)
    assert isinstance(d, Deliver) and len(d.metrics) == 3


def test_apply_trips_only_ever_trips() -> None:
    trip = Trip("endpoint", EP, Detector.VALUE_RATE, 900, 100.0, 0)
    halts = apply_trips({GLOBAL_SCOPE: HaltState.TRIPPED}, [trip])
    assert halts == {GLOBAL_SCOPE: HaltState.TRIPPED, endpoint_scope(EP): HaltState.TRIPPED}
    assert apply_trips(halts, []) == halts  # nothing closes a trip but a human, elsewhere


@pytest.mark.parametrize(("rows", "expected"), [
    ({}, GateModes(OFF, OFF, OFF)),  # a missing row reads as off
    ({(GLOBAL_SCOPE, Detector.RETRODATING): ENF}, GateModes(ENF, OFF, OFF)),
    ({(GLOBAL_SCOPE, Detector.RETRODATING): DET,
      (endpoint_scope(EP), Detector.RETRODATING): ENF}, GateModes(ENF, OFF, OFF)),
    ({(GLOBAL_SCOPE, Detector.RETRODATING): ENF,
      (endpoint_scope(EP), Detector.RETRODATING): OFF}, GateModes(ENF, OFF, OFF)),
    ({(endpoint_scope(EP), Detector.VALUE_RATE): DET,
      (GLOBAL_SCOPE, Detector.VALUE_RATE): ENF}, GateModes(OFF, DET, ENF)),
    ({(endpoint_scope("ep_other"), Detector.VALUE_RATE): ENF}, GateModes(OFF, OFF, OFF)),
])
def test_resolve_modes(rows: dict[tuple[Scope, Detector], Mode], expected: GateModes) -> None:
    assert resolve_modes(rows, EP) == expected
