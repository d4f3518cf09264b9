"""The anomaly gate's pure core (seed 000 §5.11): windows, seasonal baselines, detectors,
modes and the per-delivery decision. No Kafka, no clock, no database: callers pass event
times and the current halts, and persist what comes back.

How a gate instance uses it, per delivery (``conv = delivery["conversion"]``)::

    modes = resolve_modes(settings_rows, endpoint_id)              # missing row = off
    retro = retrodated(conv["source_created_at"], conv["source_completed_at"], window_ms)
    payout = event_time_input(payout_input(conv["payout_usd_micros"]), at, now_ms)
    # a MissingInputs payout is counted nowhere: it is both scopes' missing input
    state = rolling.add(state, conv["occurred_at"], payout)       # the endpoint's state
    ep_rate = rolling.as_rate_result(rolling.evaluate(state, thresholds, now_ms=at))
    part = accumulate(part, conv["occurred_at"], payout)          # partial for the roll-up
    match decide(endpoint_id, modes, retro, ep_rate, missing_payout_or_none, halts):
        case Deliver(metrics=m): ...                               # -> dispatch.v1
        case Hold(reason=r, metrics=m, trips=t): ...               # persist t, -> held.v1

The single aggregator (``streams/anomaly_gate/aggregate.py``) sums the partitions'
per-minute partials, feeds closed minutes to the global rolling state
(:mod:`.rolling`) and scores its spans once per batch; under enforce a global trip
becomes a halt every gate honours. An endpoint's state goes to a table changelog through
:mod:`.endpoint_state`, a partition's partial through :mod:`.persist`, the global state
through :mod:`.rolling_codec`. :mod:`.recommend` runs a history through the same detector
(calibration).
"""

from postbacks.core.anomaly.detectors import (
    RETRODATING_WINDOW_MS,
    MissingInputs,
    NoBaseline,
    Over,
    RateResult,
    Within,
    payout_input,
    retrodated,
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
    "GLOBAL_SCOPE",
    "RETRODATING_WINDOW_MS",
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
    "Scope",
    "Signal",
    "Trip",
    "Within",
    "accumulate",
    "apply_trips",
    "day_of_week",
    "decide",
    "endpoint_scope",
    "hour_of_day",
    "payout_input",
    "resolve_modes",
    "retrodated",
    "week_slot",
    "window_start",
]
