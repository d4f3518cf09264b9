"""What every gate instance must agree on: modes, thresholds and halts.

Modes and thresholds come from ``payout_anomaly_settings`` (re-read every
``anomaly_refresh_s``; a failed read keeps the last good view). Halts come from two
places, merged by ``changed_at`` (the latest change wins, a tie reads as tripped):

- the same PostgreSQL rows (durable: a restart, a rebalance or a cache flush reads them);
- ``anomaly.control.v1`` (live: a trip by any instance reaches every instance in ms).

Nothing here moves a scope from tripped to closed except a newer ``closed`` state, which
only the audited human command writes (``postbacks anomaly close``). The deployment's
global rows are the ones whose ``scope_key`` is ``anomaly_global_key``; they map to the
core's :data:`GLOBAL_SCOPE`. The endpoint row keyed ``*`` (:data:`ALL_ENDPOINTS`) is every
endpoint's default: its mode, thresholds and window apply to an endpoint without a row of
its own for that detector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from postbacks.core.anomaly import (
    ALL_ENDPOINTS,
    GLOBAL_SCOPE,
    RETRODATING_WINDOW_MS,
    Detector,
    GateModes,
    HaltState,
    Mode,
    Scope,
    Trip,
    resolve_modes,
)
from postbacks.core.anomaly.retro_burst import BURST, BurstPolicy
from postbacks.core.anomaly.rolling import ENDPOINT_ROLLING, GLOBAL_ROLLING, RollingThresholds

__all__ = ["GateConfig", "HaltBook", "StateChange", "build_config"]


@dataclass(frozen=True, slots=True)
class StateChange:
    """One halt state as read from PostgreSQL or the control topic."""

    scope: Scope  # core form: ("endpoint", id) or GLOBAL_SCOPE
    detector: str
    state: HaltState
    changed_at: int  # epoch ms; 0 when never changed


def _rolling(params: Mapping[str, Any], default: RollingThresholds) -> RollingThresholds:
    """A value-rate row's ``multiple``, ``floor_micros``, ``k`` (and, in a hand-made row,
    ``skew``; ``h``: the CUSUM arms' threshold) over the rolling detector's defaults for
    its scope; unusable params read as the defaults."""
    try:
        over: dict[str, Any] = {k: type(getattr(default, k))(params[k])
                                for k in ("multiple", "floor_micros", "k", "skew")
                                if k in params}
        if "h" in params:
            over["cusum_h"] = float(params["h"])
        return replace(default, **over)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Modes and thresholds, resolved per endpoint on demand (cached)."""

    rows: dict[tuple[Scope, Detector], Mode] = field(default_factory=dict)
    endpoint_thresholds: dict[str, RollingThresholds] = field(default_factory=dict)
    global_rolling: RollingThresholds = GLOBAL_ROLLING  # what the global scope runs
    retrodating_window_ms: dict[str, int] = field(default_factory=dict)  # per endpoint
    global_retrodating_window_ms: int = RETRODATING_WINDOW_MS
    retro_burst: BurstPolicy = BURST  # the global retrodating row's burst_count
    _cache: dict[str, GateModes] = field(default_factory=dict)

    def modes(self, endpoint_id: str) -> GateModes:
        m = self._cache.get(endpoint_id)
        if m is None:
            m = self._cache[endpoint_id] = resolve_modes(self.rows, endpoint_id)
        return m

    def thresholds(self, endpoint_id: str) -> RollingThresholds:
        """The endpoint's rolling thresholds: its own row's, else the ``*`` row's, else
        the defaults."""
        own = self.endpoint_thresholds.get(endpoint_id)
        if own is not None:
            return own
        return self.endpoint_thresholds.get(ALL_ENDPOINTS, ENDPOINT_ROLLING)

    def window_ms(self, endpoint_id: str) -> int:
        own = self.retrodating_window_ms.get(endpoint_id)
        if own is not None:
            return own
        return self.retrodating_window_ms.get(ALL_ENDPOINTS, self.global_retrodating_window_ms)

    @property
    def global_mode(self) -> Mode:
        return self.rows.get((GLOBAL_SCOPE, Detector.VALUE_RATE), Mode.OFF)

    @property
    def global_retro_mode(self) -> Mode:
        """The global retrodating row's mode: the retrodated burst's too."""
        return self.rows.get((GLOBAL_SCOPE, Detector.RETRODATING), Mode.OFF)


def core_scope(scope: str, scope_key: str, global_key: str) -> Scope | None:
    """The core's scope for a stored row, or None for another deployment's global rows."""
    if scope == "global":
        return GLOBAL_SCOPE if scope_key == global_key else None
    return (scope, scope_key) if scope == "endpoint" else None


def build_config(rows: Iterable[Any], global_key: str) -> tuple[GateConfig, list[StateChange]]:
    """GateConfig and the halt states from ``payout_anomaly_settings`` rows.

    A row is anything with ``scope, scope_key, detector, mode, params, state,
    state_changed_at_ms`` attributes. Unknown detectors or modes are ignored (they read
    as off): the CLI validates what it writes, so these can only be hand-made rows.
    """
    modes: dict[tuple[Scope, Detector], Mode] = {}
    ep_th: dict[str, RollingThresholds] = {}
    windows: dict[str, int] = {}
    g_roll = GLOBAL_ROLLING
    g_window = RETRODATING_WINDOW_MS
    burst = BURST
    states: list[StateChange] = []
    for r in rows:
        scope = core_scope(r.scope, r.scope_key, global_key)
        if scope is None:
            continue
        try:
            det, mode = Detector(r.detector), Mode(r.mode)
        except ValueError:
            continue
        modes[(scope, det)] = mode
        params = r.params or {}
        if det is Detector.VALUE_RATE:
            if scope == GLOBAL_SCOPE:
                g_roll = _rolling(params, GLOBAL_ROLLING)
            else:
                ep_th[scope[1]] = _rolling(params, ENDPOINT_ROLLING)
        else:
            if isinstance(params.get("window_ms"), int) and params["window_ms"] > 0:
                if scope == GLOBAL_SCOPE:
                    g_window = params["window_ms"]
                else:
                    windows[scope[1]] = params["window_ms"]
            count = params.get("burst_count")
            if scope == GLOBAL_SCOPE and type(count) is int and 0 <= count <= 10_000_000:
                burst = BurstPolicy(floor=count)
        if scope[1] != ALL_ENDPOINTS or scope == GLOBAL_SCOPE:  # a default never halts
            states.append(StateChange(scope, det.value, HaltState(r.state),
                                      r.state_changed_at_ms or 0))
    return GateConfig(modes, ep_th, g_roll, windows, g_window, burst), states


class HaltBook:
    """The current halt per scope: the latest change wins; a tie reads as tripped."""

    def __init__(self) -> None:
        self._latest: dict[Scope, dict[str, StateChange]] = {}  # scope -> detector -> change
        self.halts: dict[Scope, HaltState] = {}  # what ``decide`` reads; only tripped kept

    def apply(self, change: StateChange) -> bool:
        """Merge one change; True when the scope's effective state changed."""
        by_detector = self._latest.setdefault(change.scope, {})
        cur = by_detector.get(change.detector)
        if cur is not None and (change.changed_at < cur.changed_at or (
                change.changed_at == cur.changed_at and cur.state is HaltState.TRIPPED)):
            return False
        by_detector[change.detector] = change
        before = self.halts.get(change.scope)
        if any(c.state is HaltState.TRIPPED for c in by_detector.values()):
            self.halts[change.scope] = HaltState.TRIPPED
        else:
            self.halts.pop(change.scope, None)
        return before is not self.halts.get(change.scope)

    def latest(self, scope: Scope, detector: str) -> StateChange | None:
        return self._latest.get(scope, {}).get(detector)

    def trip_now(self, trip: Trip, now_ms: int) -> None:
        """This instance tripped a scope: honour it here before anyone else hears of it.
        It is dated after the scope's last change even when that one is dated ahead of
        this clock (a close from a host whose clock runs ahead): :meth:`tripped_at` is the
        date to publish and store it with, so every gate and PostgreSQL agree."""
        scope = _scope_of(trip)
        cur = self.latest(scope, trip.detector.value)
        at = now_ms if cur is None else max(now_ms, cur.changed_at + 1)
        self.apply(StateChange(scope, trip.detector.value, HaltState.TRIPPED, at))

    def tripped_at(self, trip: Trip, now_ms: int) -> int:
        """The date :meth:`trip_now` gave ``trip`` (``now_ms`` if it is not tripped)."""
        cur = self.latest(_scope_of(trip), trip.detector.value)
        return cur.changed_at if cur is not None and cur.state is HaltState.TRIPPED else now_ms

    def tripped(self) -> list[Scope]:
        return sorted(self.halts)


def _scope_of(trip: Trip) -> Scope:
    return GLOBAL_SCOPE if trip.scope == "global" else (trip.scope, trip.key)
