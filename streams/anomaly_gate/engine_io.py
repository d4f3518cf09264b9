"""The gate engine's records and keys: what a batch takes in and gives out, the table keys
of the state it keeps, its dead letters and its signal counters (engine.py)."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from postbacks.core.anomaly import PartitionPartial, Signal, Trip
from postbacks.core.anomaly.modes import HoldReason
from postbacks.core.outcomes import make_dead_letter
from postbacks.kafka.stage import fit_dead_letter
from postbacks.metrics import ANOMALY_SIGNALS, MISSING_INPUTS, RETRODATED, child
from postbacks.records import DeadLetterRecord

__all__ = ["BatchOut", "In", "count_signals", "dead_letter", "open_key", "partial_key",
           "profile_key", "ring_key"]


# An endpoint's rolling state (core.anomaly.endpoint_state); ``e:``/``h:`` keys: unread.
def profile_key(endpoint_id: str) -> str:
    return f"rp:{endpoint_id}"


def ring_key(endpoint_id: str) -> str:
    return f"rr:{endpoint_id}"


def open_key(endpoint_id: str) -> str:
    return f"ro:{endpoint_id}"


def partial_key(partition: int) -> str:
    return f"p:{partition}"


@dataclass(frozen=True, slots=True)
class In:
    """One consumed record of deliveries.v1."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    written_ms: int = 0  # the record's timestamp (0: unknown, the clock's time instead)


@dataclass(slots=True)
class BatchOut:
    records: list[tuple[str, bytes | None, bytes]] = field(default_factory=list)  # base topic
    partials: list[tuple[int, PartitionPartial, int]] = field(default_factory=list)
    trips: list[Trip] = field(default_factory=list)
    dispatched: int = 0
    held: int = 0
    dead: Counter[str] = field(default_factory=Counter)  # dead letters by reason
    redelivered: int = 0  # records handed over again in this generation: skipped


_SIGNAL_COUNTERS = {HoldReason.RETRODATED: RETRODATED,
                    HoldReason.MISSING_ANOMALY_INPUTS: MISSING_INPUTS}


@functools.cache
def _signal_counter(reason: str, mode: str) -> Any:
    return ANOMALY_SIGNALS.labels(reason, mode)


def count_signals(signals: tuple[Signal, ...]) -> None:
    for s in signals:
        _signal_counter(s.reason.value, s.mode.value).inc()
        counter = _SIGNAL_COUNTERS.get(s.reason)
        if counter is not None:
            child(counter, s.mode).inc()


def dead_letter(rec: In, exc: BaseException, reason: str, now_ms: int) -> DeadLetterRecord:
    """Cut to fit one message of the gate's producer (Faust's ``producer_max_request_size``,
    1,000,000 bytes by default, as librdkafka's): keyed by its ``original_key``."""
    return fit_dead_letter(make_dead_letter(
        topic=rec.topic, partition=rec.partition, offset=rec.offset, key=rec.key,
        value=rec.value, stage="gate", exc=exc, reason=reason, now_ms=now_ms))
