"""Arming modes, halts and the per-delivery decision of the anomaly gate.

Modes are per (scope, detector) rows of ``payout_anomaly_settings``: ``off`` skips
evaluation, ``detect`` evaluates and emits metrics but **never diverts**, ``enforce``
diverts to ``held``. **A missing row reads as off**, so nothing enforces without an
explicit, audited decision. Arming at scale is one such decision: the row of the
endpoint scope keyed :data:`ALL_ENDPOINTS` (``*``) is the default of every endpoint that
has no row of its own for that detector, new endpoints included; an endpoint's own row
(``off`` too) overrides it. The retrodating guard is per delivery: it runs under
the stronger of the global row and the endpoint's row (arming it globally arms it
everywhere). Missing or unparseable inputs are judged under the mode of the detector that
needed them: detect -> ``missing_anomaly_inputs`` metric and deliver; enforce -> hold.

Halts: a value-rate trip under enforce moves its scope ``closed -> tripped`` (a
:class:`Trip` the caller persists and publishes). While a scope is tripped **everything**
in it holds, whatever the current mode. Nothing here ever moves ``tripped -> closed``:
that is a human's audited command, elsewhere. The decision reports one hold reason, the
first of: retrodated, missing_anomaly_inputs, payout_outlier, payout_rate_global,
halted_global, payout_rate_endpoint, halted_endpoint (delivery-specific facts first, then
the widest scope); every signal that fired is in ``metrics``. A payout outlier
(:mod:`.outlier`) is judged under the endpoint's value-rate mode and holds that delivery
alone: it trips no halt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from postbacks.core.anomaly.detectors import MissingInputs, Over, RateResult

__all__ = [
    "ALL_ENDPOINTS",
    "DEFAULT_ENDPOINT_SCOPE",
    "DELIVER",
    "GLOBAL_SCOPE",
    "Decision",
    "Deliver",
    "Detector",
    "GateModes",
    "HaltState",
    "Hold",
    "HoldReason",
    "Mode",
    "Scope",
    "Signal",
    "Trip",
    "apply_trips",
    "decide",
    "endpoint_scope",
    "resolve_modes",
]


class Mode(StrEnum):
    OFF = "off"
    DETECT = "detect"
    ENFORCE = "enforce"


class Detector(StrEnum):
    RETRODATING = "retrodating"
    VALUE_RATE = "value_rate"


class HaltState(StrEnum):
    CLOSED = "closed"
    TRIPPED = "tripped"


class HoldReason(StrEnum):
    RETRODATED = "retrodated"
    MISSING_ANOMALY_INPUTS = "missing_anomaly_inputs"
    PAYOUT_OUTLIER = "payout_outlier"
    PAYOUT_RATE_GLOBAL = "payout_rate_global"
    HALTED_GLOBAL = "halted_global"
    PAYOUT_RATE_ENDPOINT = "payout_rate_endpoint"
    HALTED_ENDPOINT = "halted_endpoint"


_PRIORITY = tuple(HoldReason)  # declaration order is the reporting priority

Scope = tuple[str, str]  # ("endpoint", endpoint_id) | ("global", "*")
GLOBAL_SCOPE: Scope = ("global", "*")
ALL_ENDPOINTS = "*"  # the endpoint scope's key for "every endpoint without its own row"
DEFAULT_ENDPOINT_SCOPE: Scope = ("endpoint", ALL_ENDPOINTS)


def endpoint_scope(endpoint_id: str) -> Scope:
    return ("endpoint", endpoint_id)


_STRENGTH = {Mode.OFF: 0, Mode.DETECT: 1, Mode.ENFORCE: 2}


@dataclass(frozen=True, slots=True)
class GateModes:
    """The modes that apply to one delivery (see :func:`resolve_modes`)."""

    retrodating: Mode = Mode.OFF
    endpoint_rate: Mode = Mode.OFF
    global_rate: Mode = Mode.OFF


def resolve_modes(rows: Mapping[tuple[Scope, Detector], Mode], endpoint_id: str) -> GateModes:
    """Modes for a delivery to ``endpoint_id`` from the settings rows: the endpoint's own
    row, else the every-endpoint default row, else off."""
    ep = endpoint_scope(endpoint_id)

    def own(det: Detector) -> Mode:
        mode = rows.get((ep, det))
        return mode if mode is not None else rows.get((DEFAULT_ENDPOINT_SCOPE, det), Mode.OFF)

    g_retro = rows.get((GLOBAL_SCOPE, Detector.RETRODATING), Mode.OFF)
    e_retro = own(Detector.RETRODATING)
    return GateModes(
        retrodating=max(g_retro, e_retro, key=_STRENGTH.__getitem__),
        endpoint_rate=own(Detector.VALUE_RATE),
        global_rate=rows.get((GLOBAL_SCOPE, Detector.VALUE_RATE), Mode.OFF),
    )


@dataclass(frozen=True, slots=True)
class Signal:
    """A metric tag: this detector fired (or could not evaluate) under this mode."""

    reason: HoldReason
    mode: Mode


@dataclass(frozen=True, slots=True)
class Trip:
    """``closed -> tripped`` for a scope; the caller persists it and publishes it."""

    scope: str
    key: str
    detector: Detector
    observed: int
    baseline: float
    window_start_ms: int
    detail: str | None = None  # what tripped (the rolling detector: span and score)


@dataclass(frozen=True, slots=True)
class Deliver:
    metrics: tuple[Signal, ...] = ()


@dataclass(frozen=True, slots=True)
class Hold:
    reason: HoldReason
    metrics: tuple[Signal, ...] = ()
    trips: tuple[Trip, ...] = ()
    detail: str | None = None  # missing_anomaly_inputs: the fields, missing or unparseable

    def describe(self) -> str:
        """The reason as an outcome records it, with the fields named when inputs failed."""
        return self.reason.value if self.detail is None else f"{self.reason.value}: {self.detail}"


Decision = Deliver | Hold
DELIVER = Deliver()
_LOUD = frozenset({Over, MissingInputs})  # results that can produce a signal
_NO_HALTS: Mapping[Scope, HaltState] = MappingProxyType({})


def _rate(result: RateResult | MissingInputs | None, mode: Mode, scope: Scope,
          over: HoldReason, halted: bool, metrics: list[Signal], holds: set[HoldReason],
          trips: list[Trip]) -> None:
    if mode is Mode.OFF or result is None:
        return
    match result:
        case Over(window_start_ms=w, observed_micros=o, baseline_micros=b):
            metrics.append(Signal(over, mode))
            if mode is Mode.ENFORCE and not halted:
                holds.add(over)
                trips.append(Trip(scope[0], scope[1], Detector.VALUE_RATE, o, b, w))
        case MissingInputs():
            metrics.append(Signal(HoldReason.MISSING_ANOMALY_INPUTS, mode))
            if mode is Mode.ENFORCE:
                holds.add(HoldReason.MISSING_ANOMALY_INPUTS)
        case _:
            pass


def decide(endpoint_id: str, modes: GateModes, retro: bool | MissingInputs,
           endpoint_rate: RateResult | MissingInputs,
           global_rate: RateResult | MissingInputs | None = None,
           halts: Mapping[Scope, HaltState] = _NO_HALTS, outlier: bool = False) -> Decision:
    """Deliver or hold one delivery.

    ``retro`` is :func:`~.detectors.retrodated`'s result, the rates are the rolling
    detector's results (:func:`~.rolling.as_rate_result`) for the endpoint and, where this
    process evaluates it, the global scope (``None`` when the aggregator does: a global
    trip then reaches the gate as a halt), or the endpoint's missing payout. ``halts`` maps a
    scope to its state; a missing scope is closed. ``outlier``: the payout is far above
    the endpoint's peak (:func:`.outlier.judge`).
    """
    ep_halted = g_halted = False
    if halts:
        g_halted = halts.get(GLOBAL_SCOPE) is HaltState.TRIPPED
        ep_halted = halts.get(endpoint_scope(endpoint_id)) is HaltState.TRIPPED
    elif (retro is False and not outlier and type(endpoint_rate) not in _LOUD
          and type(global_rate) not in _LOUD):
        return DELIVER  # the hot path: nothing fired, nothing halted
    metrics: list[Signal] = []
    holds: set[HoldReason] = set()
    trips: list[Trip] = []
    rmode = modes.retrodating
    if rmode is not Mode.OFF and retro is not False:
        reason = HoldReason.RETRODATED if retro is True else HoldReason.MISSING_ANOMALY_INPUTS
        metrics.append(Signal(reason, rmode))
        if rmode is Mode.ENFORCE:
            holds.add(reason)
    if outlier and modes.endpoint_rate is not Mode.OFF:
        metrics.append(Signal(HoldReason.PAYOUT_OUTLIER, modes.endpoint_rate))
        if modes.endpoint_rate is Mode.ENFORCE:
            holds.add(HoldReason.PAYOUT_OUTLIER)
    _rate(global_rate, modes.global_rate, GLOBAL_SCOPE, HoldReason.PAYOUT_RATE_GLOBAL,
          g_halted, metrics, holds, trips)
    _rate(endpoint_rate, modes.endpoint_rate, endpoint_scope(endpoint_id),
          HoldReason.PAYOUT_RATE_ENDPOINT, ep_halted, metrics, holds, trips)
    if g_halted:
        holds.add(HoldReason.HALTED_GLOBAL)
    if ep_halted:
        holds.add(HoldReason.HALTED_ENDPOINT)
    signals = tuple(dict.fromkeys(metrics))  # unique, in order
    if not holds:
        return Deliver(signals) if signals else DELIVER
    reason = next(r for r in _PRIORITY if r in holds)
    detail = None
    if reason is HoldReason.MISSING_ANOMALY_INPUTS:
        failed = [x for x in (retro, global_rate, endpoint_rate) if isinstance(x, MissingInputs)]
        detail = "; ".join(dict.fromkeys(x.describe() for x in failed)) or None
    return Hold(reason, signals, tuple(trips), detail)


def apply_trips(halts: Mapping[Scope, HaltState], trips: Iterable[Trip]) -> dict[Scope, HaltState]:
    """New halt states after ``trips``: closed -> tripped only; a trip is never undone here."""
    out = dict(halts)
    for t in trips:
        out[(t.scope, t.key)] = HaltState.TRIPPED
    return out
