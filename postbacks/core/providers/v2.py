"""V2: GET to a URL template with ``{macro}`` placeholders, Standard Webhooks signed.

``endpoint.url`` is a template such as ``https://pub.example/cb?cid={conversion_id}``.
Each macro value is percent-encoded as a whole (``quote(value, safe="")``), so a value
can never add a query parameter, a path segment or a fragment; literal text is the
endpoint's own config and is sent as written. Macros are allowed only after the host:
the scheme and host are fixed at save time, so conversion data can never choose where
a postback goes (the SSRF check runs on a host the configuration named).

The body is empty, so the Standard Webhooks signature covers the **request target**
too: ``{id}.{timestamp}.{target}``, the path and query exactly as on the request line
(``/cb?cid=cv_1&amt=1.250000``). The values are in the URL, and a signature over nothing
lets anyone who saw one request send its headers with other values. A receiver verifies
with its usual library by passing the raw target as the payload. ``webhook-signature``
carries the target's signatures first, then those over the empty body that v2 always
sent (the canonical string is a contract: receivers written against it keep working).
The rendered URL is sent byte for byte (:mod:`postbacks.core.targets`): literal text the
template wrote unencoded (a space, a non-ASCII letter) is percent-encoded at render, and
a macro value of ``.`` or ``..`` is sent as ``%2E``/``%2E%2E``, not as a literal
dot-segment (a server that decodes before resolving dot-segments may still resolve it).
V3's payload settings (``schema_version``, ``fields``, ``aliases``) do not apply here and
are refused rather than silently ignored.
"""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

from yarl import URL

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
from postbacks.core.targets import request_target
from postbacks.records import DeliveryRecord

__all__ = ["V2Provider", "template_problems"]


def _quote(value: str) -> str:
    if value.strip(".") == "":  # "." or "..": a dot-segment a server would resolve
        return "%2E" * len(value)
    return quote(value, safe="")


# what a path and query may hold as written: delimiters, unreserved characters, escapes
_URL_SAFE = "/?:@!$&'()*+,;=%~"
_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _encoded(url: str) -> str:
    """``url`` as the client sends it byte for byte (:mod:`postbacks.core.targets`): an
    internationalized host in its ASCII form, and the template's literal text after the
    host percent-encoded where it is not URL text already (a space, a non-ASCII letter,
    ``[``, a ``%`` that starts no escape); escapes are kept."""
    start = url.find("//") + 2 if "//" in url else 0
    cut = min((i for i in (url.find("/", start), url.find("?", start)) if i >= 0),
              default=len(url))
    head = url[:cut] if url[:cut].isascii() else str(URL(url[:cut]))
    return head + quote(_STRAY_PERCENT.sub("%25", url[cut:]), safe=_URL_SAFE)


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
    if "#" in url:
        problems.append("a fragment (#...) is never sent: the text and macros after # "
                        "would be lost; put them in the query")
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
        url = _encoded(expand(endpoint.url, d, quote=_quote))
        keys = require_active_keys(endpoint, now_ms)
        body = b""
        # the values are in the URL: sign its target; then the empty body, as v2 always
        # did (a frozen contract): receivers that verify that one go on working, those
        # that verify the target authenticate the values
        signed = (request_target(url).encode(), body)
        headers = {**standard_webhook_headers(d, keys, *signed, now_ms=now_ms),
                   **delivery_headers(d)}
        headers = merge_custom_headers(headers, endpoint, self.reserved_headers)
        return RenderedRequest("GET", url, headers, body)


register(V2Provider())
