"""Rendering a delivery into the exact request bytes (V3: POST JSON canonical envelope).

Render is pure and loud: a delivery that cannot be rendered raises :class:`RenderError`
(-> ``render_failed``, DLQ) before any HTTP call, never a blank-but-2xx postback. Signing
happens over the exact body bytes returned here.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from postbacks.core.endpoint import Endpoint, active_keys
from postbacks.core.signing import signature_header
from postbacks.records import DeliveryRecord

__all__ = ["ENVELOPE_VERSION", "RenderError", "RenderedRequest", "render"]

ENVELOPE_VERSION = 1


class RenderError(Exception):
    """The delivery cannot be rendered with the endpoint's current config."""


@dataclass(frozen=True, slots=True)
class RenderedRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes


def _v3_body(d: DeliveryRecord) -> bytes:
    c = d["conversion"]
    payout = c["payout_usd_micros"]
    data = {
        "conversion_id": c["conversion_id"],
        "app_id": c["app_id"],
        "event_type": c["event_type"],
        "goal_id": c["goal_id"],
        "payout_usd": None if payout is None else f"{payout / 1_000_000:.6f}",
        "occurred_at": c["occurred_at"],
    }
    envelope = {
        "schema_version": ENVELOPE_VERSION,
        "type": c["event_type"],
        "id": d["idempotency_key"],
        "data": data,
    }
    return orjson.dumps(envelope)


def render(d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
    if endpoint.provider != "v3":
        raise RenderError(f"unknown provider {endpoint.provider!r}")
    keys = active_keys(endpoint, now_ms)
    if not keys:
        raise RenderError(f"endpoint {endpoint.endpoint_id} has no active signing secret")
    body = _v3_body(d)
    ts = now_ms // 1000
    msg_id = d["idempotency_key"]
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": signature_header(keys, msg_id, ts, body),
        "idempotency-key": msg_id,
        "postback-attempt": str(d["attempt"] + 1),
    }
    return RenderedRequest("POST", endpoint.url, headers, body)
