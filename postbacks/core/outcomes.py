"""Builders for the records an attempt produces (Attempt, Outcome); pure."""

from __future__ import annotations

from postbacks.core.render import RenderedRequest
from postbacks.ids import new_id
from postbacks.records import AttemptRecord, DeadLetterRecord, DeliveryRecord, OutcomeRecord

__all__ = ["REDACTED_HEADERS", "make_attempt", "make_dead_letter", "make_outcome"]

REDACTED_HEADERS = frozenset({"webhook-signature", "authorization", "x-partner-signature"})
# What an attempt record keeps of its request: the record must fit one Kafka message
# (1 MB) whatever the conversion carried, so a longer body or header value is cut, saying
# how long it was. The request as sent is whole.
STORED_BODY_BYTES = 64 * 1024
STORED_TEXT_CHARS = 8 * 1024


def _cut_text(v: str) -> str:
    if len(v) <= STORED_TEXT_CHARS:
        return v
    return v[:STORED_TEXT_CHARS] + f"...[cut: {len(v):,} characters]"


def _cut_body(b: bytes | None) -> bytes | None:
    if b is None or len(b) <= STORED_BODY_BYTES:
        return b
    return b[:STORED_BODY_BYTES] + f"...[cut: {len(b):,} bytes]".encode()


def make_attempt(
    d: DeliveryRecord, *, now_ms: int, result: str, req: RenderedRequest | None,
    status: int | None = None, error_class: str | None = None, error_message: str | None = None,
    queue_ms: float = 0.0, platform_ms: float = 0.0, wire_ms: float = 0.0,
    excerpt: bytes | None = None, attempted_at: int | None = None,
    attempt_id: str | None = None, agent_instance: str | None = None,
) -> AttemptRecord:
    """One attempt's record; ``attempt_id`` given when its intent already carried one (the
    intent and the attempt share it), ``agent_instance`` names the agent process."""
    headers = {} if req is None else {
        k: ("[redacted]" if k.lower() in REDACTED_HEADERS else _cut_text(v))
        for k, v in req.headers.items()
    }
    return AttemptRecord(
        attempt_id=attempt_id or new_id("att", now_ms),
        delivery_id=d["delivery_id"],
        endpoint_id=d["endpoint_id"],
        idempotency_key=d["idempotency_key"],
        attempt_no=d["attempt"] + 1,
        trigger=d["trigger"],
        attempted_at=attempted_at if attempted_at is not None else now_ms,
        result=result,
        status_code=status,
        error_class=error_class,
        error_message=error_message[:2000] if error_message else error_message,
        queue_ms=queue_ms,
        platform_ms=platform_ms,
        wire_ms=wire_ms,
        request_method=req.method if req else "",
        request_url=_cut_text(req.url) if req else "",
        request_headers=headers,
        request_body=_cut_body(req.body) if req else None,
        response_excerpt=excerpt,
        agent_instance=agent_instance,
    )


def make_outcome(
    d: DeliveryRecord, kind: str, *, now_ms: int, reason: str | None = None,
    actor: str | None = None, attempt_no: int | None = None,
) -> OutcomeRecord:
    c = d["conversion"]
    return OutcomeRecord(
        outcome_id=new_id("out", now_ms),
        kind=kind,
        delivery_id=d["delivery_id"],
        endpoint_id=d["endpoint_id"],
        app_id=c["app_id"],
        conversion_id=c["conversion_id"],
        event_type=c["event_type"],
        goal_id=c["goal_id"],
        idempotency_key=d["idempotency_key"],
        payout_usd_micros=c["payout_usd_micros"] if kind == "delivered" else None,
        attempt_no=d["attempt"] + 1 if attempt_no is None else attempt_no,
        occurred_at=now_ms,
        reason=reason,
        actor=actor,
    )


def make_dead_letter(
    *, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
    stage: str, exc: BaseException, reason: str, now_ms: int,
    delivery_id: str | None = None, endpoint_id: str | None = None,
) -> DeadLetterRecord:
    """A dead letter keeping the original bytes and where they came from."""
    return DeadLetterRecord(
        dead_letter_id=new_id("dlq", now_ms), reason=reason, error_class=type(exc).__name__,
        error_message=str(exc)[:2000], stage=stage, origin_topic=topic,
        origin_partition=partition, origin_offset=offset, original_key=key,
        original_value=value, delivery_id=delivery_id, endpoint_id=endpoint_id,
        occurred_at=now_ms,
    )
