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

__all__ = ["MAX_URL_BYTES", "RenderError", "RenderedRequest", "render"]

# A rendered URL longer than this is a render error, not a request: receivers refuse far
# shorter ones (414), and conversion data that long in a URL is a fault upstream.
MAX_URL_BYTES = 16 * 1024


def render(d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
    """The request to send for ``d`` now; raises :class:`RenderError`."""
    if endpoint.config_error:
        raise RenderError(f"endpoint {endpoint.endpoint_id} config: {endpoint.config_error}")
    req = get_provider(endpoint.provider).render(d, endpoint, now_ms=now_ms)
    if len(req.url) > MAX_URL_BYTES:
        raise RenderError(f"the rendered URL is {len(req.url):,} characters, over the "
                          f"{MAX_URL_BYTES:,} a postback URL may have (a long value in a "
                          "URL macro?)")
    return req
