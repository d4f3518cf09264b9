"""The global aggregator's retrodated burst (postbacks/core/anomaly/retro_burst.py): the
partials' retrodated counts summed per minute, the halt under the global retrodating row's
enforce, and its state across restarts, releases and lagging partitions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import REGISTRY

from postbacks.core.anomaly import GLOBAL_SCOPE, Detector, HaltState, Trip
from postbacks.db.anomaly import AnomalyRow
from streams.anomaly_gate.aggregate import GLOBAL_ROLL
from streams.anomaly_gate.config import StateChange
from tests.unit.test_gate_aggregate import _SOURCE, GKEY, MIN, NOW, PARTIAL, T0, USD, Agg, row


def retro_row(mode: str, params: dict[str, Any] | None = None) -> AnomalyRow:
    """The global retrodating row, with the burst at 50 unless ``params`` say otherwise."""
    return AnomalyRow("global", GKEY, "retrodating", mode,
                      {"burst_count": 50} if params is None else params, "closed", None, None)


def retro_partial(partition: int, window: int, count: int, retro: int) -> bytes:
    return PARTIAL.encode({"partition": partition, "window_start": window,
                           "total_micros": count * USD, "count": count, "retrodated": retro,
                           "source_offset": next(_SOURCE), "produced_at": NOW})


def _burst(a: Agg, per_min: int = 3, minutes: int = 12, start: int = T0) -> list[Trip]:
    """Two partitions, 10 conversions a minute each, ``per_min`` of them retrodated in
    each: a cumulative partial per minute and partition."""
    trips: list[Trip] = []
    for m in range(minutes):
        trips += a.feed(retro_partial(0, start + m * MIN, 10, per_min),
                        retro_partial(1, start + m * MIN, 10, per_min))
    return trips


def test_a_burst_of_retrodated_deliveries_halts_the_global_scope_under_enforce() -> None:
    a = Agg(retro_row("enforce"), partitions=2)
    trips = _burst(a)  # 6 a minute: the span reaches 50 in its ninth minute
    assert len(trips) == 1, trips
    t = trips[0]
    assert (t.scope, t.detector, t.window_start_ms) == ("global", Detector.RETRODATING, T0)
    assert t.observed >= 50 and t.detail is not None
    assert t.detail.startswith("9-min span (retrodated burst): 54 retrodated deliveries")
    assert a.agg.halts.halts == {GLOBAL_SCOPE: HaltState.TRIPPED}


@pytest.mark.parametrize("rows", [(), (row("enforce"),), (retro_row("off"),),
                                  (retro_row("enforce", {}),),  # opt-in: no count, no burst
                                  (retro_row("enforce", {"burst_count": 0}),),
                                  (retro_row("enforce", {"burst_count": 100}),)])
def test_no_halt_without_the_global_retrodating_row_at_enforce_or_under_its_count(
        rows: tuple[AnomalyRow, ...]) -> None:
    a = Agg(*rows, partitions=2)
    assert _burst(a) == []  # 72 retrodated in 12 minutes


def test_under_detect_a_burst_is_a_signal_once_per_span_start() -> None:
    def signals() -> float:
        return REGISTRY.get_sample_value("postbacks_anomaly_signals_total",
                                         {"reason": "retrodated_burst", "mode": "detect"}) or 0

    before = signals()
    a = Agg(retro_row("detect"), partitions=2)
    assert _burst(a) == [] and a.agg.halts.halts == {}
    assert signals() == before + 1
    assert REGISTRY.get_sample_value("postbacks_anomaly_retro_burst",
                                     {"quantity": "threshold"}) == 50


def test_a_closed_burst_halt_does_not_trip_again_on_the_same_minutes() -> None:
    a = Agg(retro_row("enforce"), partitions=2)
    assert len(_burst(a, minutes=9)) == 1
    a.agg.halts.apply(StateChange(GLOBAL_SCOPE, "retrodating", HaltState.CLOSED, NOW + 1))
    assert _burst(a, per_min=0, minutes=6, start=T0 + 9 * MIN) == []  # quiet minutes after
    assert _burst(a, per_min=5, minutes=4, start=T0 + 15 * MIN) == []  # 40 since the close
    assert len(_burst(a, per_min=5, minutes=2, start=T0 + 19 * MIN)) == 1  # 60: a new one


def test_the_burst_state_survives_a_restart_and_reads_the_older_form() -> None:
    a = Agg(retro_row("enforce"), partitions=2)
    assert _burst(a, minutes=6) == []  # 36 so far
    restarted = Agg(retro_row("enforce"), store=a.store, partitions=2)
    restarted.offset = a.offset
    trips = _burst(restarted, minutes=3, start=T0 + 6 * MIN)
    assert len(trips) == 1 and trips[0].observed == 54
    # What a release from before the burst wrote: no retrodated counts, no burst state.
    # (The keys written now are its keys plus parts_r, wins_r and burst, which it ignores:
    # a rollback reads this state whole.)
    old = json.loads(json.dumps(a.store[GLOBAL_ROLL]))
    assert {len(i.split(":")) for i in old["parts"].split(";")} == {6}
    assert {len(i.split(":")) for i in old["wins"].split(";") if i} <= {3}
    for key in ("parts_r", "wins_r", "burst"):
        del old[key]
    legacy = Agg(retro_row("enforce"), store={GLOBAL_ROLL: old}, partitions=2)
    legacy.offset = restarted.offset
    legacy.feed(retro_partial(0, T0 + 9 * MIN, 10, 0), retro_partial(1, T0 + 9 * MIN, 10, 0))
    assert legacy.agg.loaded and legacy.agg.burst.minute == (T0 + 8 * MIN) // MIN
    assert legacy.agg.parts[0][5] == 0  # the older form's partials read as none retrodated


def test_an_unreadable_burst_state_starts_the_burst_afresh_and_keeps_the_rest() -> None:
    a = Agg(retro_row("enforce"), partitions=2)
    _burst(a, minutes=6)
    a.store[GLOBAL_ROLL]["burst"] = "garbage"
    again = Agg(retro_row("enforce"), store=a.store, partitions=2)
    again.offset = a.offset
    again.feed(retro_partial(0, T0 + 6 * MIN, 10, 0), retro_partial(1, T0 + 6 * MIN, 10, 0))
    assert again.agg.state.minute is not None and again.agg.offset >= a.agg.offset
    assert again.agg.burst.ring == (6,)  # afresh: only the minute still open is known


def test_a_lagging_partitions_old_retrodated_counts_do_not_pile_into_one_minute() -> None:
    """Partition 1 is an hour behind, one retrodated a minute (the usual for it); when it
    catches up, its old minutes' retrodated counts must not land in the open minute."""
    a = Agg(retro_row("enforce"), partitions=2)
    trips: list[Trip] = []
    for m in range(70):
        trips += a.feed(retro_partial(0, T0 + m * MIN, 10, 1),
                        retro_partial(1, T0 + max(0, m - 60) * MIN, 10 * (m + 1), 1))
    for m in range(10, 70):  # partition 1 catches up: a partial per minute it was behind
        trips += a.feed(retro_partial(1, T0 + m * MIN, 10, 1))
    assert trips == []
