"""The anomaly gate's pure core (seed 000 §5.11): windows, seasonal baselines, detectors,
modes and the per-delivery decision. No Kafka, no clock, no database: callers pass event
times and the current halts, and persist what comes back.

How a gate instance uses it, per delivery (``conv = delivery["conversion"]``)::

    modes = resolve_modes(settings_rows, endpoint_id)              # missing row = off
    retro = retrodated(conv["source_created_at"], conv["source_completed_at"], window_ms)
    ep_state, ep_rate = observe(ep_state, conv["occurred_at"], conv["payout_usd_micros"],
                                endpoint_thresholds)               # table keyed by endpoint
    part = accumulate(part, conv["occurred_at"], payout)          # partial for the roll-up
    match decide(endpoint_id, modes, retro, ep_rate, None, halts):
        case Deliver(metrics=m): ...                               # -> dispatch.v1
        case Hold(reason=r, metrics=m, trips=t): ...               # persist t, -> held.v1

The single aggregator (``streams/anomaly_gate/aggregate.py``) sums the partitions'
per-minute partials, feeds closed minutes to the global rolling state
(:mod:`.rolling`) and scores its spans once per batch; under enforce a global trip
becomes a halt every gate honours. State goes to a table changelog through :mod:`.persist`.
:mod:`.replay` runs a whole history through the same rules in one process (calibration).
"""

from postbacks.core.anomaly.baseline import (
    BaselinePolicy,
    SeasonalBaseline,
    add,
    baseline,
    close_until,
    empty,
    from_dict,
    to_dict,
)
from postbacks.core.anomaly.detectors import (
    ENDPOINT_THRESHOLDS,
    GLOBAL_THRESHOLDS,
    RETRODATING_WINDOW_MS,
    MissingInputs,
    NoBaseline,
    Over,
    RateResult,
    RateThresholds,
    Within,
    observe,
    payout_input,
    retrodated,
    value_rate,
)
from postbacks.core.anomaly.modes import (
    ALL_ENDPOINTS,
    DEFAULT_ENDPOINT_SCOPE,
    GLOBAL_SCOPE,
    Decision,
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
from postbacks.core.anomaly.rollup import PartitionPartial, accumulate
from postbacks.core.anomaly.windows import (
    DEFAULT_WINDOW_MS,
    day_of_week,
    hour_of_day,
    week_slot,
    window_start,
)

__all__ = [
    "ALL_ENDPOINTS",
    "DEFAULT_ENDPOINT_SCOPE",
    "DEFAULT_WINDOW_MS",
    "ENDPOINT_THRESHOLDS",
    "GLOBAL_SCOPE",
    "GLOBAL_THRESHOLDS",
    "RETRODATING_WINDOW_MS",
    "BaselinePolicy",
    "Decision",
    "Deliver",
    "Detector",
    "GateModes",
    "HaltState",
    "Hold",
    "HoldReason",
    "MissingInputs",
    "Mode",
    "NoBaseline",
    "Over",
    "PartitionPartial",
    "RateResult",
    "RateThresholds",
    "Scope",
    "SeasonalBaseline",
    "Signal",
    "Trip",
    "Within",
    "accumulate",
    "add",
    "apply_trips",
    "baseline",
    "close_until",
    "day_of_week",
    "decide",
    "empty",
    "endpoint_scope",
    "from_dict",
    "hour_of_day",
    "observe",
    "payout_input",
    "resolve_modes",
    "retrodated",
    "to_dict",
    "value_rate",
    "week_slot",
    "window_start",
]
