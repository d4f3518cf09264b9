"""Edit-and-replay overrides: a one-off change to how ONE re-driven copy is rendered.

Support fixing a delivery in the console may override, for that re-drive only, the URL
(which is also the V2 macro mapping: the macros are in the URL template), the V3 field
subset and the key aliases. The override travels on the Delivery record (``override``, a
JSON string, schema v2); the agent applies it to the endpoint's *current* config before
rendering, so everything else (secrets, validator, headers) stays the endpoint's own.

:func:`parse_override` is strict (unknown keys, wrong types, an empty override and anything
over :data:`MAX_OVERRIDE_BYTES` are refused with a message naming the problem);
:func:`apply_override` returns the endpoint to render with; :func:`override_diff` is what
the console shows before the replay. The SSRF address check of an overridden URL is I/O
(done by the console's adapter on save, and by the agent's transport on every connect).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from postbacks.core.endpoint import Endpoint

__all__ = [
    "MAX_OVERRIDE_BYTES",
    "Override",
    "OverrideError",
    "apply_override",
    "headers_may_go",
    "host_of",
    "override_diff",
    "parse_override",
    "same_target",
    "scheme_of",
]

MAX_OVERRIDE_BYTES = 8192  # an override is a fix, not a payload
_MAX_URL = 2048
_KEYS = ("url", "fields", "aliases")


class OverrideError(ValueError):
    """An override that cannot be used, in words for the person who typed it."""


@dataclass(frozen=True, slots=True)
class Override:
    url: str | None = None
    fields: tuple[str, ...] | None = None
    aliases: Mapping[str, str] | None = None

    def to_json(self) -> str:
        out: dict[str, Any] = {}
        if self.url is not None:
            out["url"] = self.url
        if self.fields is not None:
            out["fields"] = list(self.fields)
        if self.aliases is not None:
            out["aliases"] = dict(self.aliases)
        return json.dumps(out, sort_keys=True, separators=(",", ":"))


def parse_override(raw: str | Mapping[str, Any] | None) -> Override | None:
    """The override in ``raw`` (a JSON string or an already-parsed object); ``None`` for
    no override. Raises :class:`OverrideError`."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, str):
        if len(raw.encode()) > MAX_OVERRIDE_BYTES:
            raise OverrideError(f"override is larger than {MAX_OVERRIDE_BYTES} bytes")
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise OverrideError(f"override is not JSON: {exc}") from exc
        except RecursionError:
            raise OverrideError("override is nested too deeply") from None
    else:
        data = raw
        try:
            size = len(json.dumps(data, default=str).encode())
        except RecursionError:
            raise OverrideError("override is nested too deeply") from None
        if size > MAX_OVERRIDE_BYTES:
            raise OverrideError(f"override is larger than {MAX_OVERRIDE_BYTES} bytes")
    if not isinstance(data, Mapping):
        raise OverrideError("override must be a JSON object with url, fields or aliases")
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise OverrideError(f"unknown override key(s): {', '.join(unknown)} "
                            f"(allowed: {', '.join(_KEYS)})")
    url = data.get("url")
    if url is not None:
        if not isinstance(url, str) or not url.strip():
            raise OverrideError("url must be a non-empty string")
        if len(url) > _MAX_URL:
            raise OverrideError(f"url is longer than {_MAX_URL} characters")
        url = url.strip()
    fields = data.get("fields")
    if fields is not None:
        if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
            raise OverrideError("fields must be a list of non-empty strings")
        fields = tuple(fields)
    aliases = data.get("aliases")
    if aliases is not None:
        if not isinstance(aliases, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in aliases.items()
        ):
            raise OverrideError("aliases must be an object of non-empty strings")
        aliases = MappingProxyType(dict(aliases))
    if url is None and fields is None and aliases is None:
        raise OverrideError("override changes nothing: give url, fields or aliases")
    return Override(url=url, fields=fields, aliases=aliases)


def host_of(url: str) -> str:
    """A URL's host as compared with an endpoint's own and its ``test_hosts``: lower-case,
    no trailing dot, an IP literal in its canonical form ("" when there is none)."""
    try:
        host = (urlsplit(url).hostname or "").lower().rstrip(".")
    except ValueError:
        return ""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def scheme_of(url: str) -> str:
    """A URL's scheme, lower-case ("" when it has none or cannot be read)."""
    try:
        return urlsplit(url).scheme.lower()
    except ValueError:
        return ""


def same_target(a: str, b: str) -> bool:
    """Whether two URL templates name the same scheme, host, port and path (the query may
    differ). One host may serve many tenants, one path each (webhook relays): another path
    or port on an endpoint's host is not the endpoint."""
    try:
        x, y = urlsplit(a), urlsplit(b)
        schemes = (x.scheme.lower(), y.scheme.lower())
        ports = (x.port or _DEFAULT_PORTS.get(schemes[0]), y.port or _DEFAULT_PORTS.get(schemes[1]))
    except ValueError:
        return False
    origin = (schemes[0] == schemes[1] and ports[0] == ports[1]) or (
        schemes == ("http", "https") and ports == (80, 443))  # the same, over TLS
    return (origin and bool(host_of(a)) and host_of(a) == host_of(b)
            and _ESCAPE.sub(_upper, x.path or "/") == _ESCAPE.sub(_upper, y.path or "/"))


_DEFAULT_PORTS = {"http": 80, "https": 443}
_ESCAPE = re.compile(r"%[0-9a-fA-F]{2}")


def _upper(m: re.Match[str]) -> str:
    return m.group(0).upper()


def headers_may_go(endpoint: Endpoint, url: str, by: str | None) -> bool:
    """Whether a copy retargeted to ``url`` may carry the endpoint's custom headers, judged
    when it is sent (the console judged it when the replay was queued; the endpoint may
    have gained headers, or lost a test host, since): never from an https endpoint over
    http; to anything but the endpoint's own URL (:func:`same_target`) or a host of its
    ``test_hosts``, only when an admin queued it (``by``: the copy's ``triggered_by``,
    ``admin:…``)."""
    if scheme_of(endpoint.url) == "https" and scheme_of(url) != "https":
        return False
    if same_target(endpoint.url, url) or host_of(url) in endpoint.config.test_hosts:
        return True
    return (by or "").startswith("admin:")


def apply_override(endpoint: Endpoint, override: Override | None, *,
                   by: str | None = None) -> Endpoint:
    """``endpoint`` as this copy renders it; ``by``: who queued the copy (its
    ``triggered_by``): a retargeted copy drops the endpoint's custom headers where
    :func:`headers_may_go` says they may not go."""
    if override is None:
        return endpoint
    config = endpoint.config
    if override.fields is not None:
        config = replace(config, fields=override.fields)
    if override.aliases is not None:
        config = replace(config, aliases=override.aliases)
    if override.url and config.headers and not headers_may_go(endpoint, override.url, by):
        config = replace(config, headers=MappingProxyType({}))
    return replace(endpoint, url=override.url or endpoint.url, config=config)


def override_diff(endpoint: Endpoint, override: Override) -> list[tuple[str, str, str]]:
    """``(what, current, override)`` for every value the override changes."""
    out: list[tuple[str, str, str]] = []
    if override.url is not None and override.url != endpoint.url:
        out.append(("url", endpoint.url, override.url))
    if override.fields is not None and override.fields != endpoint.config.fields:
        cur = "(default)" if endpoint.config.fields is None else ", ".join(endpoint.config.fields)
        out.append(("fields", cur, ", ".join(override.fields)))
    if override.aliases is not None and dict(override.aliases) != dict(endpoint.config.aliases):
        out.append(("aliases", json.dumps(dict(endpoint.config.aliases), sort_keys=True),
                    json.dumps(dict(override.aliases), sort_keys=True)))
    return out
