"""Fan-out: one conversion event -> one delivery per subscribed endpoint.

Pure: validation and planning take the event, the endpoints and ``now``; the stage runner
does the I/O. A conversion no endpoint subscribes to yields no delivery (that is not an
error). Re-fanning the same event yields the same delivery ids (identity is deterministic).
"""

from __future__ import annotations

from collections.abc import Iterable

from postbacks.core.endpoint import Endpoint
from postbacks.core.identity import delivery_id, idempotency_key
from postbacks.errors import InvalidRecord
from postbacks.records import ConversionEvent, DeliveryRecord

__all__ = ["REQUIRED_FIELDS", "plan_deliveries", "validate_conversion"]

REQUIRED_FIELDS = ("event_id", "conversion_id", "app_id", "event_type")


def validate_conversion(event: ConversionEvent) -> None:
    """Raise :class:`InvalidRecord` (reason ``missing_field``) for an unusable event."""
    missing = [f for f in REQUIRED_FIELDS if not str(event.get(f) or "").strip()]
    if missing:
        raise InvalidRecord(
            f"conversion {event.get('conversion_id')!r}: required field(s) missing or empty: "
            + ", ".join(missing),
            reason="missing_field",
        )
    if event.get("occurred_at", 0) <= 0:
        raise InvalidRecord("occurred_at must be a positive epoch-ms time", reason="missing_field")


def plan_deliveries(
    event: ConversionEvent, endpoints: Iterable[Endpoint], *, idem_key: bytes, now_ms: int
) -> list[DeliveryRecord]:
    out: list[DeliveryRecord] = []
    for ep in endpoints:
        if not ep.subscribes(event["app_id"], event["event_type"]):
            continue
        ident = (ep.endpoint_id, event["conversion_id"], event["event_type"], event["goal_id"])
        out.append(
            DeliveryRecord(
                delivery_id=delivery_id(*ident),
                endpoint_id=ep.endpoint_id,
                idempotency_key=idempotency_key(idem_key, *ident),
                conversion=event,
                created_at=now_ms,
                attempt=0,
                trigger="initial",
                triggered_by=None,
                due_at=None,
                enqueued_at=now_ms,
                first_attempt_at=None,
                hold_reason=None,
                last_error=None,
            )
        )
    return out
