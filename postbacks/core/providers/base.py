"""The provider contract, the provider registry, and the helpers providers share.

A provider turns a delivery plus an endpoint's current config into the exact request
bytes: method, URL, headers, body, and its signing. That is all a provider varies;
resilience (retries, backoff, dead-lettering, idempotency, attempt records) lives in the
stages and applies to every provider alike. Adding a provider is one subclass of
:class:`Provider` and one :func:`register` call.

Policy shared by every provider:

* Render is pure and loud. Anything that keeps a delivery from rendering exactly as
  configured raises :class:`RenderError` (-> ``render_failed``) before any HTTP call.
* ``check_config`` reports at save time every config problem ``render`` would raise on
  (same wording), so bad config is refused when saved, and still fails loudly at render
  if it was stored anyway.
* Every request carries ``idempotency-key`` (stable across retries, replays and edits)
  and ``postback-attempt`` (1-based). Custom headers from the endpoint config may add
  headers but never replace one the provider sets (signing, identity, content type).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from yarl import URL

from postbacks.core.endpoint import Endpoint, ValidatorSpec, active_keys
from postbacks.core.macros import RenderError
from postbacks.core.signing import signature_header
from postbacks.records import DeliveryRecord

__all__ = [
    "DELIVERY_HEADERS",
    "STANDARD_WEBHOOK_HEADERS",
    "Provider",
    "RenderError",
    "RenderedRequest",
    "delivery_headers",
    "get_provider",
    "header_problems",
    "merge_custom_headers",
    "provider_names",
    "register",
    "require_active_keys",
    "standard_webhook_headers",
    "url_problems",
]


@dataclass(frozen=True, slots=True)
class RenderedRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes


DELIVERY_HEADERS = frozenset({"idempotency-key", "postback-attempt"})
STANDARD_WEBHOOK_HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature"})

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


class Provider(ABC):
    """One way of delivering a postback. Instances are stateless and shared.

    ``reserved_headers`` are the (lower-case) headers this provider sets itself, which
    custom headers may not override. ``options`` are the ``provider_options`` keys it
    accepts; any other key is a config problem.
    """

    name: ClassVar[str]
    default_validator: ClassVar[ValidatorSpec | None] = None
    reserved_headers: ClassVar[frozenset[str]] = DELIVERY_HEADERS
    options: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def render(self, d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
        """The exact request to send now; raises :class:`RenderError`."""

    def check_config(self, endpoint: Endpoint) -> list[str]:
        """Problems with the endpoint's config for this provider ([] = fine).

        Subclasses extend this (call ``super().check_config``) with their own checks.
        """
        problems = url_problems(endpoint.url)
        problems += header_problems(endpoint.config.headers, self.reserved_headers)
        unknown = sorted(set(endpoint.config.provider_options) - self.options)
        if unknown:
            problems.append(
                f"provider {self.name!r} does not accept option(s): {', '.join(unknown)}"
            )
        return problems


_REGISTRY: dict[str, Provider] = {}


def register(provider: Provider) -> Provider:
    """Add ``provider`` under its ``name``; a second provider with the same name is a bug."""
    if provider.name in _REGISTRY:
        raise ValueError(f"provider {provider.name!r} is already registered")
    _REGISTRY[provider.name] = provider
    return provider


def get_provider(name: str) -> Provider:
    """The registered provider called ``name``; :class:`RenderError` if there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise RenderError(f"unknown provider {name!r}") from None


def provider_names() -> list[str]:
    """Registered provider names, sorted (the valid values of ``endpoints.provider``)."""
    return sorted(_REGISTRY)


def require_active_keys(endpoint: Endpoint, now_ms: int) -> list[bytes]:
    """Keys that sign now; :class:`RenderError` if there is none (never send unsigned)."""
    keys = active_keys(endpoint, now_ms)
    if not keys:
        raise RenderError(f"endpoint {endpoint.endpoint_id} has no active signing secret")
    return keys


def delivery_headers(d: DeliveryRecord) -> dict[str, str]:
    """``idempotency-key`` and the 1-based ``postback-attempt`` of the attempt being made."""
    return {"idempotency-key": d["idempotency_key"], "postback-attempt": str(d["attempt"] + 1)}


def standard_webhook_headers(
    d: DeliveryRecord, keys: list[bytes], *contents: bytes, now_ms: int
) -> dict[str, str]:
    """Standard Webhooks ``webhook-id``/``-timestamp``/``-signature``: one signature per
    key over each of ``contents`` in turn (the body; ``v2``: its target, then the empty
    body it always signed).

    The message id is the idempotency key, so a receiver deduping on ``webhook-id``
    dedupes across retries and replays too.
    """
    ts = now_ms // 1000
    msg_id = d["idempotency_key"]
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(signature_header(keys, msg_id, ts, c) for c in contents),
    }


def url_problems(url: str) -> list[str]:
    """Problems with an endpoint URL: it must parse, be http(s), and name a host.

    (Whether the host resolves to a public address is the SSRF guard's business.)
    """
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        return [f"URL does not parse: {exc}"]
    problems: list[str] = []
    if any(c < " " or c == "\x7f" for c in url):  # yarl drops CR, LF and tab unseen
        problems.append("URL contains a control character (a line break, a tab, ...)")
    if parts.scheme not in ("http", "https"):
        problems.append(f"URL scheme must be http or https, not {parts.scheme!r}")
    if not host:
        problems.append("URL has no host")
    else:
        try:  # as the transport reads and resolves it (IDNA both ways)
            target = URL(url)
            _ = target.host
            (target.raw_host or "").encode("idna")
        except (ValueError, TypeError) as exc:  # UnicodeError is a ValueError
            problems.append(f"URL host {host!r} is not a valid DNS name: {exc}")
    return problems


# Set by the HTTP client from the request itself; a custom copy is dropped when sending.
CLIENT_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
    "te", "trailer", "proxy-connection", "expect",
})


def saved_header_problems(headers: Mapping[str, str]) -> list[str]:
    """What a person saving custom headers is told beyond :func:`header_problems` (not
    checked when rendering: a configuration saved before still sends as it did)."""
    problems: list[str] = []
    for name, value in headers.items():
        if name.lower() in CLIENT_HEADERS:
            problems.append(f"custom header {name!r} is set by the HTTP client from the "
                            "request (yours would be dropped)")
        if not value.isascii():
            problems.append(f"header {name!r} has a non-ASCII character in its value (not "
                            "every HTTP client can send it: percent-encode it)")
    return problems


def header_problems(headers: Mapping[str, str], reserved: Iterable[str]) -> list[str]:
    """Problems with custom headers: invalid names/values, or overriding a reserved one."""
    reserved_lc = frozenset(reserved)
    problems: list[str] = []
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            problems.append(f"header name {name!r} is not a valid HTTP token")
        elif name.lower() in reserved_lc:
            problems.append(f"custom header {name!r} may not override a header the provider sets")
        if _BAD_VALUE.search(value):
            problems.append(f"header {name!r} has a control character in its value")
    return problems


def merge_custom_headers(
    headers: dict[str, str], endpoint: Endpoint, reserved: Iterable[str]
) -> dict[str, str]:
    """``headers`` plus the endpoint's custom headers; :class:`RenderError` on a problem."""
    custom = endpoint.config.headers
    problems = header_problems(custom, reserved)
    if problems:
        raise RenderError("; ".join(problems))
    return {**headers, **custom}
