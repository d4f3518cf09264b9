"""Typed views of the Avro records (``schemas/avro/``), as the codec returns them.

Plain dicts on the hot path (fastavro reads and writes dicts); these TypedDicts let mypy
check every access. A contract test keeps their keys equal to the latest schema's fields.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

__all__ = [
    "AttemptRecord",
    "BreakerStateRecord",
    "ConversionEvent",
    "DeadLetterRecord",
    "DeliveryRecord",
    "OperationalEventRecord",
    "OutcomeRecord",
    "PayoutPartialRecord",
]


class ConversionEvent(TypedDict):
    event_id: str
    conversion_id: str
    app_id: str
    event_type: str
    goal_id: str | None
    payout_usd_micros: int | None
    source_created_at: int | None
    source_completed_at: int | None
    occurred_at: int
    source_snapshot: dict[str, str]
    original_amount: str | None
    original_currency: str | None
    producer: str | None


class DeliveryRecord(TypedDict):
    delivery_id: str
    endpoint_id: str
    idempotency_key: str
    conversion: ConversionEvent
    created_at: int
    attempt: int
    trigger: str
    triggered_by: str | None
    due_at: int | None
    enqueued_at: int | None
    first_attempt_at: int | None
    hold_reason: str | None
    last_error: str | None
    override: NotRequired[str | None]  # v2: console edit-and-replay (core/override.py)


class AttemptRecord(TypedDict):
    attempt_id: str
    delivery_id: str
    endpoint_id: str
    idempotency_key: str
    attempt_no: int
    trigger: str
    attempted_at: int
    result: str
    status_code: int | None
    error_class: str | None
    error_message: str | None
    queue_ms: float
    platform_ms: float
    wire_ms: float
    request_method: str
    request_url: str
    request_headers: dict[str, str]
    request_body: bytes | None
    response_excerpt: bytes | None
    agent_instance: NotRequired[str | None]  # v2: the agent process (intents, agent_lost)


class OutcomeRecord(TypedDict):
    outcome_id: str
    kind: str
    delivery_id: str
    endpoint_id: str
    app_id: str
    conversion_id: str
    event_type: str
    goal_id: str | None
    idempotency_key: str
    payout_usd_micros: int | None
    attempt_no: int
    occurred_at: int
    reason: str | None
    actor: str | None


class DeadLetterRecord(TypedDict):
    dead_letter_id: str
    reason: str
    error_class: str
    error_message: str
    stage: str
    origin_topic: str
    origin_partition: int
    origin_offset: int
    original_key: bytes | None
    original_value: bytes | None
    delivery_id: str | None
    endpoint_id: str | None
    occurred_at: int


class BreakerStateRecord(TypedDict):
    scope: str
    scope_key: str
    detector: str
    state: str
    changed_at: int
    reason: str | None
    actor: str | None
    observed_value: float | None
    baseline_value: float | None
    # v2, circuit breakers (detector "circuit" on breakers.v1; core/breaker.py)
    opened_at: NotRequired[int | None]
    ramp_started_at: NotRequired[int | None]
    consecutive_failures: NotRequired[int | None]


class PayoutPartialRecord(TypedDict):
    partition: int
    window_start: int
    total_micros: int
    count: int
    retrodated: int  # v3 (0 when read from an older writer)
    source_offset: int
    produced_at: int


class OperationalEventRecord(TypedDict):
    event_id: str
    kind: str
    endpoint_id: str | None
    app_id: str | None
    occurred_at: int
    reason: str | None
    actor: str | None
    detail: dict[str, str]
