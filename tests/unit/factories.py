"""Record builders for the pure-core tests."""

from __future__ import annotations

from typing import Any

from postbacks.records import ConversionEvent, DeliveryRecord


def make_conversion(**over: Any) -> ConversionEvent:
    base: dict[str, Any] = dict(
        event_id="evt_1", conversion_id="cv_1", app_id="app_1", event_type="conversion",
        goal_id=None, payout_usd_micros=1_250_000, source_created_at=1_700_000_100_000,
        source_completed_at=1_700_000_000_000, occurred_at=1_700_000_200_000,
        source_snapshot={"player_id": "p1", "amount": "1.25"}, original_amount=None,
        original_currency=None, producer="test",
    )
    base.update(over)
    return ConversionEvent(**base)  # type: ignore[typeddict-item]


def make_delivery(**over: Any) -> DeliveryRecord:
    base: dict[str, Any] = dict(
        delivery_id="dlv_1", endpoint_id="ep_1", idempotency_key="msg_abc",
        conversion=make_conversion(), created_at=1_700_000_200_000, attempt=0,
        trigger="initial", triggered_by=None, due_at=None, enqueued_at=1_700_000_200_000,
        first_attempt_at=None, hold_reason=None, last_error=None, override=None,
    )
    base.update(over)
    return DeliveryRecord(**base)  # type: ignore[typeddict-item]


class FakeMessage:
    """What the stages read of a consumed Kafka message (pure-core tests)."""

    def __init__(self, value: bytes, *, topic: str = "dispatch.v1", partition: int = 0,
                 offset: int = 0, key: bytes | None = None, error: Any = None) -> None:
        self._value, self._topic, self._key = value, topic, key
        self._partition, self._offset, self._error = partition, offset, error

    def error(self) -> Any:
        return self._error

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset
