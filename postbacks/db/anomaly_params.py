"""The params of a ``payout_anomaly_settings`` row: which detector each configures, and
their checks (:func:`validate_params`, run before anything is written)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from postbacks.core.anomaly.modes import Detector

__all__ = ["validate_params"]

# Which detector each param configures.
_PARAM_DETECTOR = {
    "multiple": Detector.VALUE_RATE,
    "floor_micros": Detector.VALUE_RATE,
    "k": Detector.VALUE_RATE,
    "h": Detector.VALUE_RATE,
    "single_multiple": Detector.VALUE_RATE,
    "window_ms": Detector.RETRODATING,
    "burst_count": Detector.RETRODATING,
}


def validate_params(detector: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Checked, normalised params: ``multiple`` (float >= 1), ``floor_micros`` (int >= 0),
    ``k`` and ``h`` (float > 0), ``single_multiple`` (0: off, or float >= 1) for
    value_rate, ``window_ms`` (int > 0) and ``burst_count`` (int 0..10,000,000, global
    rows only: the retrodated burst) for retrodating; anything else is a ValueError."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        owner = _PARAM_DETECTOR.get(key)
        if owner is None:
            raise ValueError(f"unknown param {key!r}: allowed are multiple, floor_micros, k, "
                             "h, single_multiple (value_rate), window_ms and burst_count "
                             "(retrodating)")
        if owner != detector:
            raise ValueError(f"param {key!r} configures {owner.value}, not {detector}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"param {key!r} must be a number, not {value!r}")
        if key == "multiple":
            if not math.isfinite(value) or value < 1:
                raise ValueError(f"multiple must be a finite number >= 1 (a span over that "
                                 f"multiple of its expectation), not {value!r}")
            out[key] = float(value)
        elif key == "single_multiple":
            if not math.isfinite(value) or not (value == 0 or value >= 1):
                raise ValueError(f"single_multiple must be 0 (off) or a finite number >= 1 "
                                 f"(a payout over that multiple of the endpoint's peak), "
                                 f"not {value!r}")
            out[key] = float(value)
        elif key in ("k", "h"):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{key} must be a finite number > 0, not {value!r}")
            out[key] = float(value)
        elif not isinstance(value, int):
            raise ValueError(f"param {key!r} must be an integer, not {value!r}")
        elif key == "floor_micros" and value < 0:
            raise ValueError(f"floor_micros must be >= 0, not {value}")
        elif key == "window_ms" and value <= 0:
            raise ValueError(f"window_ms must be > 0, not {value}")
        elif key == "burst_count" and not 0 <= value <= 10_000_000:
            raise ValueError(f"burst_count must be 0 (off) .. 10,000,000, not {value}")
        else:
            out[key] = value
    return out
