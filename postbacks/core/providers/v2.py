"""V2: GET to a URL template with ``{macro}`` placeholders, Standard Webhooks signed.

``endpoint.url`` is a template such as ``https://pub.example/cb?cid={conversion_id}``.
Each macro value is percent-encoded as a whole (``quote(value, safe="")``), so a value
can never add a query parameter, a path segment or a fragment; literal text is the
endpoint's own config and is sent as written. Macros are allowed only after the host:
the scheme and host are fixed at save time, so conversion data can never choose where
a postback goes (the SSRF check runs on a host the configuration named).

The body is empty; the Standard Webhooks signature covers ``{id}.{timestamp}.`` (the
empty body), so a receiver can still authenticate the call with its usual library.
V3's payload settings (``schema_version``, ``fields``, ``aliases``) do not apply here and
are refused rather than silently ignored.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from postbacks.core.endpoint import Endpoint, EndpointConfig
from postbacks.core.macros import RenderError, expand, find_macros, get_macro
from postbacks.core.providers.base import (
    DELIVERY_HEADERS,
    STANDARD_WEBHOOK_HEADERS,
    Provider,
    RenderedRequest,
    delivery_headers,
    merge_custom_headers,
    register,
    require_active_keys,
    standard_webhook_headers,
    url_problems,
)
from postbacks.records import DeliveryRecord

__all__ = ["V2Provider", "template_problems"]


def _quote(value: str) -> str:
    return quote(value, safe="")


def template_problems(url: str) -> list[str]:
    """Problems with a URL template: braces, unknown macros, URL shape, macros in the host."""
    try:
        names = find_macros(url)
    except RenderError as exc:
        return [str(exc)]
    problems = [f"unknown macro {{{n}}}" for n in names if get_macro(n) is None]
    problems += url_problems(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        return problems  # reported by url_problems
    if any(c in parts.scheme + parts.netloc for c in "{}"):
        problems.append("macros are allowed only in the path and query, not the host")
    return problems


_DEFAULT_CONFIG = EndpointConfig()


def _unused_payload_config(config: EndpointConfig) -> list[str]:
    problems: list[str] = []
    if config.schema_version != _DEFAULT_CONFIG.schema_version:
        problems.append("schema_version applies to v3 only")
    if config.fields is not None or config.aliases:
        problems.append("fields/aliases apply to v3 and partner only")
    return problems


class V2Provider(Provider):
    """GET with URL macros, empty body."""

    name = "v2"
    reserved_headers = DELIVERY_HEADERS | STANDARD_WEBHOOK_HEADERS

    def check_config(self, endpoint: Endpoint) -> list[str]:
        problems = super().check_config(endpoint)
        extra = template_problems(endpoint.url) + _unused_payload_config(endpoint.config)
        return problems + [p for p in extra if p not in problems]

    def render(self, d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
        problems = template_problems(endpoint.url) + _unused_payload_config(endpoint.config)
        if problems:
            raise RenderError("; ".join(problems))
        url = expand(endpoint.url, d, quote=_quote)
        keys = require_active_keys(endpoint, now_ms)
        body = b""
        headers = {**standard_webhook_headers(d, keys, body, now_ms=now_ms), **delivery_headers(d)}
        headers = merge_custom_headers(headers, endpoint, self.reserved_headers)
        return RenderedRequest("GET", url, headers, body)


register(V2Provider())
