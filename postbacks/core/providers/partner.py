"""Partner: the reference custom provider (a Partnerize-style partner).

It differs from V3 only in transport and signing, and overrides only those:

* POST ``application/x-www-form-urlencoded``: the schema-version-1 canonical fields
  (the endpoint's ``fields`` subset and ``aliases`` honoured) plus ``idempotency_key``.
  A null field is sent as an empty value, so the set of keys is stable.
* Signed the partner's way: ``x-partner-signature: sha256=<hex HMAC-SHA256(key, body)>``
  with the first active key (the partner holds one secret; during a rotation overlap
  that is the older key) and ``x-partner-timestamp`` (epoch seconds). No ``webhook-*``
  headers.
* Like every provider, ``idempotency-key`` and ``postback-attempt`` are sent.

This partner answers failures with ``200`` and an empty body, so its default response
validator is ``non_empty_body``: an endpoint is not left on status-only by omission.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from postbacks.core.endpoint import Endpoint, ValidatorSpec
from postbacks.core.macros import RenderError
from postbacks.core.providers.base import (
    DELIVERY_HEADERS,
    Provider,
    RenderedRequest,
    delivery_headers,
    merge_custom_headers,
    register,
    require_active_keys,
)
from postbacks.core.providers.v3 import field_problems, select_fields
from postbacks.records import DeliveryRecord

__all__ = ["PartnerProvider", "partner_signature"]

_VERSION = 1
_IDEMPOTENCY_FIELD = "idempotency_key"


def partner_signature(key: bytes, body: bytes) -> str:
    """The ``x-partner-signature`` value: ``sha256=`` + hex HMAC-SHA256 of the body."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


class PartnerProvider(Provider):
    """Form-encoded POST with the partner's own HMAC signature."""

    name = "partner"
    default_validator = ValidatorSpec("non_empty_body")
    reserved_headers = DELIVERY_HEADERS | {
        "content-type", "x-partner-signature", "x-partner-timestamp",
    }

    def _problems(self, endpoint: Endpoint) -> list[str]:
        problems = field_problems(
            endpoint.config, _VERSION, reserved_keys=(_IDEMPOTENCY_FIELD,)
        )
        if endpoint.config.schema_version != _VERSION:
            problems.append(f"provider 'partner' sends schema version {_VERSION} fields only")
        return problems

    def check_config(self, endpoint: Endpoint) -> list[str]:
        return super().check_config(endpoint) + self._problems(endpoint)

    def render(self, d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
        problems = self._problems(endpoint)
        if problems:
            raise RenderError("; ".join(problems))
        pairs = [
            (key, "" if value is None else str(value))
            for key, value in select_fields(d, endpoint.config, _VERSION)
        ]
        pairs.append((_IDEMPOTENCY_FIELD, d["idempotency_key"]))
        body = urlencode(pairs).encode()
        key = require_active_keys(endpoint, now_ms)[0]
        headers = {
            "content-type": "application/x-www-form-urlencoded",
            "x-partner-signature": partner_signature(key, body),
            "x-partner-timestamp": str(now_ms // 1000),
            **delivery_headers(d),
        }
        headers = merge_custom_headers(headers, endpoint, self.reserved_headers)
        return RenderedRequest("POST", endpoint.url, headers, body)


register(PartnerProvider())
