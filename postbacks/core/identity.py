"""Delivery identity and the idempotency key publishers see.

``delivery_id`` is deterministic from (endpoint_id, conversion_id, event_type, goal_id): a
replayed or re-fanned event collapses onto the same delivery. The idempotency key is an
opaque HMAC of that identity under a platform key — stable across retries, replays, edits
and releases, and revealing no internal id to the receiver.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from postbacks.ids import derived_id

__all__ = ["delivery_id", "idempotency_key"]


def delivery_id(endpoint_id: str, conversion_id: str, event_type: str, goal_id: str | None) -> str:
    return derived_id("dlv", endpoint_id, conversion_id, event_type, goal_id)


def idempotency_key(
    key: bytes, endpoint_id: str, conversion_id: str, event_type: str, goal_id: str | None
) -> str:
    msg = "\x1f".join(
        [endpoint_id, conversion_id, event_type, "\x00" if goal_id is None else "\x01" + goal_id]
    ).encode()
    digest = hmac.new(key, msg, hashlib.sha256).digest()[:20]
    return "msg_" + base64.b32encode(digest).decode().lower().rstrip("=")
