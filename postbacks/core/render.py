"""Rendering a delivery into the exact request bytes, through the provider registry.

Render is pure and loud: a delivery that cannot be rendered raises :class:`RenderError`
(-> ``render_failed``, DLQ) before any HTTP call, never a blank-but-2xx postback. It
renders from the delivery's write-once snapshot plus the endpoint's *current* config; an
endpoint whose stored config no longer parses (``config_error``) renders nothing rather
than something guessed. Signing happens inside the provider, over the exact bytes sent.
"""

from __future__ import annotations

from postbacks.core.endpoint import Endpoint
from postbacks.core.providers import RenderedRequest, RenderError, get_provider
from postbacks.records import DeliveryRecord

__all__ = ["RenderError", "RenderedRequest", "render"]


def render(d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
    """The request to send for ``d`` now; raises :class:`RenderError`."""
    if endpoint.config_error:
        raise RenderError(f"endpoint {endpoint.endpoint_id} config: {endpoint.config_error}")
    return get_provider(endpoint.provider).render(d, endpoint, now_ms=now_ms)
