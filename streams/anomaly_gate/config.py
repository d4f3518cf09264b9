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
    resolve_modes,
)
from postbacks.core.anomaly.halts import HaltBook, StateChange, core_scope
from postbacks.core.anomaly.retro_burst import BURST, BurstPolicy
from postbacks.core.anomaly.rolling import ENDPOINT_ROLLING, GLOBAL_ROLLING, RollingThresholds

__all__ = ["GateConfig", "HaltBook", "StateChange", "build_config", "core_scope"]


_ROLLING = ("multiple", "floor_micros", "k", "skew", "single_multiple")  # the row's params


def _rolling(params: Mapping[str, Any], default: RollingThresholds) -> RollingThresholds:
    """A value-rate row's ``multiple``, ``floor_micros``, ``k`` (and, in a hand-made row,
    ``skew``; ``h``: the CUSUM arms' threshold) over the rolling detector's defaults for
    its scope; unusable params read as the defaults."""
    try:
        over: dict[str, Any] = {k: type(getattr(default, k))(params[k]) for k in _ROLLING
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
