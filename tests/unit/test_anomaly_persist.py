"""A partition's partial for the global roll-up in the gate's table: round trip and
malformed values (an endpoint's rolling state: test_endpoint_state.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from postbacks.core.anomaly.persist import NOTHING, dump_partial, restore_partial
from postbacks.core.anomaly.rollup import PartitionPartial
from postbacks.core.anomaly.windows import HOUR_MS, WEEK_MS

T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS


def _json(v: Any) -> Any:
    return json.loads(json.dumps(v))


# --- partition partials -------------------------------------------------------------------


@pytest.mark.parametrize(("part", "offset"), [
    (PartitionPartial(T0, 123_456), 7),
    (PartitionPartial(T0 + WEEK_MS, 0), 0),
    (PartitionPartial(), NOTHING),
])
def test_partial_round_trip(part: PartitionPartial, offset: int) -> None:
    assert restore_partial(_json(dump_partial(part, offset))) == (part, offset)


def test_restore_partial_of_nothing() -> None:
    assert restore_partial(None) == (PartitionPartial(), NOTHING)


@pytest.mark.parametrize("raw", [
    "x", [1], {"w": "1", "t": 1, "o": 1}, {"w": 1, "t": None, "o": 1},
    {"w": 1, "t": 1}, {"w": 1, "t": 1, "o": 1.0}, {"w": 1.5, "t": 1, "o": 1},
])
def test_malformed_partial_raises(raw: object) -> None:
    with pytest.raises(ValueError):
        restore_partial(raw)
