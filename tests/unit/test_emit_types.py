"""The producer helper names every field of the wrong type, and refuses an event too large
for its delivery, before producing: these used to raise a TypeError from inside a check
(a NULL in source_snapshot, a missing occurred_at), or a ``cannot encode`` naming no
field (a float payout, a number for an id), or to be produced and dead-lettered by the
fan-out as ``too_large``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from postbacks.errors import InvalidRecord
from postbacks.settings import load_settings
from tests.unit.factories import make_conversion


class _NoProducer:
    def __init__(self) -> None:
        self.produced: list[bytes] = []

    def produce(self, _topic: str, value: bytes, *_a: Any, **_kw: Any) -> None:
        self.produced.append(value)

    def poll(self, _t: float) -> int:
        return 0


@pytest.fixture
def emit(monkeypatch: pytest.MonkeyPatch) -> Any:
    import postbacks.kafka.clients as clients
    from postbacks.emit import ConversionProducer

    kafka = _NoProducer()
    monkeypatch.setattr(clients, "Producer", lambda _conf: kafka)
    producer = ConversionProducer(load_settings({}))
    producer.kafka = kafka  # type: ignore[attr-defined]
    return producer


NOW = int(time.time() * 1000)


@pytest.mark.parametrize(("change", "named"), [
    ({"source_snapshot": {"amount": None, "player_id": "p1"}},
     "source_snapshot must be a map of string values, not 1 entry that are not ('amount'"),
    ({"source_snapshot": {"n": 12.5}}, "source_snapshot must be a map of string values"),
    ({"occurred_at": None}, "occurred_at is missing (a whole number within 64 bits)"),
    ({"payout_usd_micros": 1.5e6},
     "payout_usd_micros must be a whole number within 64 bits (or null), not float"),
    ({"payout_usd_micros": "1500000"}, "payout_usd_micros must be a whole number"),
    ({"payout_usd_micros": True}, "payout_usd_micros must be a whole number"),
    ({"payout_usd_micros": 2**63}, "payout_usd_micros must be a whole number"),
    ({"event_id": 123}, "event_id must be a string, not int"),
    ({"source_created_at": 1.7e12}, "source_created_at must be a whole number"),
])
def test_a_field_of_the_wrong_type_is_named(emit: Any, change: dict[str, Any],
                                            named: str) -> None:
    times = {"occurred_at": NOW - 1000, "source_created_at": NOW - 2000,
             "source_completed_at": NOW - 3000}
    event = make_conversion(**{**times, **change})
    with pytest.raises(InvalidRecord) as exc:
        emit.send(event)
    assert named in str(exc.value), str(exc.value)
    assert emit.kafka.produced == []


def test_a_missing_required_field_is_still_reported_as_missing(emit: Any) -> None:
    event = make_conversion(occurred_at=NOW - 1000)
    del event["event_id"]  # type: ignore[misc]
    with pytest.raises(InvalidRecord, match=r"required field.*event_id"):
        emit.send(event)


def test_an_event_too_large_for_its_delivery_is_refused_unsent(emit: Any) -> None:
    big = {f"k{i}": "x" * 1000 for i in range(940)}  # about 940 KB of snapshot
    with pytest.raises(InvalidRecord, match="bytes encoded, over the") as exc:
        emit.send(make_conversion(occurred_at=NOW - 1000, source_snapshot=big))
    assert exc.value.reason == "too_large"
    assert emit.kafka.produced == []
    emit.send(make_conversion(occurred_at=NOW - 1000, source_created_at=NOW - 2000,
                              source_completed_at=NOW - 3000))  # a plain one goes
    assert len(emit.kafka.produced) == 1


def test_integer_types_and_named_types_are_the_encoders_to_judge() -> None:
    from postbacks.core.field_types import type_problems

    class Int64:  # what numpy gives for a whole number
        def __index__(self) -> int:
            return 7

    fields = [{"name": "n", "type": "long"}, {"name": "kind",
              "type": {"type": "enum", "name": "K", "symbols": ["a"]}},
              {"name": "x", "type": "double"}]
    assert type_problems({"n": Int64(), "kind": "a", "x": 3}, fields) == []
    assert type_problems({"n": 2**63, "kind": "a", "x": "3"}, fields) == [
        "n must be a whole number within 64 bits, not int", "x must be a number, not str"]


@pytest.mark.parametrize("change", [{"producer": "x\ud800"},
                                    {"source_snapshot": {"a": "\udcff"}},
                                    {"goal_id": "g\udfff"}])
def test_a_string_utf_8_cannot_hold_is_an_invalid_record(emit: Any,
                                                         change: dict[str, Any]) -> None:
    """A lone surrogate passes the type checks and then failed in the encoder as a plain
    ValueError: a caller catching InvalidRecord, as documented, crashed."""
    event = make_conversion(occurred_at=NOW - 1000, **change)
    with pytest.raises(InvalidRecord, match="cannot be encoded") as exc:
        emit.send(event)
    assert exc.value.reason == "invalid_field"
    assert emit.kafka.produced == []
