"""An endpoint's configuration as the stages see it (loaded from PostgreSQL).

``EndpointConfig`` is the parsed form of the ``endpoints.config`` JSON column. Parsing is
strict: an unknown key or a wrong type is a :class:`ConfigError` naming the key, so bad
config is refused when it is saved; an endpoint whose stored config no longer parses is
loaded with ``config_error`` set and its deliveries fail to render (``render_failed``)
instead of being sent with a guessed config.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from postbacks.errors import ConfigError

__all__ = ["Endpoint", "EndpointConfig", "SigningSecret", "ValidatorSpec", "active_keys"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class SigningSecret:
    secret_id: str
    key: bytes = field(repr=False)
    active_from_ms: int
    active_until_ms: int | None = None

    def active_at(self, now_ms: int) -> bool:
        return self.active_from_ms <= now_ms and (
            self.active_until_ms is None or now_ms < self.active_until_ms
        )


@dataclass(frozen=True, slots=True)
class ValidatorSpec:
    """Response validator: ``status_only`` | ``non_empty_body`` | ``body_matches`` |
    ``json_field``. Params: body_matches ``{"pattern": <regex>}``; json_field
    ``{"field": "a.b", "op": "exists"|"equals"|"not_equals", "value": <json>}``."""

    kind: str = "status_only"
    params: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)


_CONFIG_KEYS = {
    "schema_version", "fields", "aliases", "validator", "on_validation_failure",
    "redact_fields", "max_attempts", "follow_redirects", "headers", "provider_options",
    "disable_on_gone", "notify_endpoint_id", "test_hosts", "ordering",
}
ORDERINGS = ("none", "strict")
MAX_TEST_HOSTS = 20
_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
                        r"(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*")


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    schema_version: int = 1
    fields: tuple[str, ...] | None = None  # V3 field subset; None = the version's defaults
    aliases: Mapping[str, str] = field(default_factory=lambda: _EMPTY)  # canonical -> sent key
    validator: ValidatorSpec | None = None  # None = the provider's default (else status_only)
    on_validation_failure: str = "hold"  # hold | retry
    redact_fields: tuple[str, ...] = ()  # body/query fields masked in attempt records
    max_attempts: int | None = None
    follow_redirects: bool = False
    headers: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    provider_options: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    disable_on_gone: bool = False  # a 410 Gone disables the endpoint at once (postbacks monitor)
    notify_endpoint_id: str | None = None  # ep_... the owner's notifications go to (notifier)
    # Hosts besides the URL's own that support may test-send or edit-and-replay to (console).
    test_hosts: tuple[str, ...] = ()
    # "strict": a delivery is not sent before the previous one to this endpoint is
    # resolved (streams/strict.py; head-of-line blocking, one request at a time).
    ordering: str = "none"

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> EndpointConfig:
        """Parse the stored JSON; raises :class:`ConfigError` naming the bad key."""
        if not data:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError("endpoint config must be a JSON object")
        unknown = sorted(set(data) - _CONFIG_KEYS)
        if unknown:
            raise ConfigError(f"unknown endpoint config key(s): {', '.join(unknown)}")
        kw: dict[str, Any] = {}
        if "schema_version" in data:
            kw["schema_version"] = _int(data, "schema_version", minimum=1)
        if data.get("fields") is not None:
            kw["fields"] = tuple(_str_list(data, "fields"))
        if "aliases" in data:
            kw["aliases"] = MappingProxyType(dict(_str_map(data, "aliases")))
        if data.get("validator") is not None:
            v = data["validator"]
            if not isinstance(v, Mapping) or not isinstance(v.get("kind"), str):
                raise ConfigError('validator must be {"kind": <name>, ...params}')
            kw["validator"] = ValidatorSpec(
                v["kind"], MappingProxyType({k: x for k, x in v.items() if k != "kind"})
            )
        if "on_validation_failure" in data:
            mode = data["on_validation_failure"]
            if mode not in ("hold", "retry"):
                raise ConfigError("on_validation_failure must be 'hold' or 'retry'")
            kw["on_validation_failure"] = mode
        if "redact_fields" in data:
            kw["redact_fields"] = tuple(_str_list(data, "redact_fields"))
        if data.get("max_attempts") is not None:
            kw["max_attempts"] = _int(data, "max_attempts", minimum=1)
        if "follow_redirects" in data:
            if not isinstance(data["follow_redirects"], bool):
                raise ConfigError("follow_redirects must be true or false")
            kw["follow_redirects"] = data["follow_redirects"]
        if "disable_on_gone" in data:
            if not isinstance(data["disable_on_gone"], bool):
                raise ConfigError("disable_on_gone must be true or false")
            kw["disable_on_gone"] = data["disable_on_gone"]
        if data.get("notify_endpoint_id") is not None:
            target = data["notify_endpoint_id"]
            if not isinstance(target, str) or not target.startswith("ep_") or not target[3:]:
                raise ConfigError("notify_endpoint_id must be an endpoint id (ep_...)")
            kw["notify_endpoint_id"] = target
        if data.get("test_hosts") is not None:
            kw["test_hosts"] = _test_hosts(data)
        if "ordering" in data:
            if data["ordering"] not in ORDERINGS:
                raise ConfigError("ordering must be 'none' or 'strict'")
            kw["ordering"] = data["ordering"]
        if "headers" in data:
            kw["headers"] = MappingProxyType(dict(_str_map(data, "headers")))
        if "provider_options" in data:
            if not isinstance(data["provider_options"], Mapping):
                raise ConfigError("provider_options must be a JSON object")
            kw["provider_options"] = MappingProxyType(dict(data["provider_options"]))
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": self.schema_version}
        if self.fields is not None:
            out["fields"] = list(self.fields)
        if self.aliases:
            out["aliases"] = dict(self.aliases)
        if self.validator is not None:
            out["validator"] = {"kind": self.validator.kind, **self.validator.params}
        out["on_validation_failure"] = self.on_validation_failure
        if self.redact_fields:
            out["redact_fields"] = list(self.redact_fields)
        if self.max_attempts is not None:
            out["max_attempts"] = self.max_attempts
        out["follow_redirects"] = self.follow_redirects
        if self.headers:
            out["headers"] = dict(self.headers)
        if self.provider_options:
            out["provider_options"] = dict(self.provider_options)
        if self.disable_on_gone:
            out["disable_on_gone"] = True
        if self.notify_endpoint_id is not None:
            out["notify_endpoint_id"] = self.notify_endpoint_id
        if self.test_hosts:
            out["test_hosts"] = list(self.test_hosts)
        if self.ordering != "none":
            out["ordering"] = self.ordering
        return out


def _int(data: Mapping[str, Any], key: str, *, minimum: int) -> int:
    value = data[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}")
    return value


def _str_list(data: Mapping[str, Any], key: str) -> list[str]:
    value = data[key]
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
        raise ConfigError(f"{key} must be a list of non-empty strings")
    return value


def _test_hosts(data: Mapping[str, Any]) -> tuple[str, ...]:
    """``test_hosts``: bare host names or IP literals (no scheme, port or path), at most
    :data:`MAX_TEST_HOSTS`, kept lower-case (as a URL's host is compared)."""
    hosts = _str_list(data, "test_hosts")
    if len(hosts) > MAX_TEST_HOSTS:
        raise ConfigError(f"test_hosts holds at most {MAX_TEST_HOSTS} hosts")
    out: list[str] = []
    for raw in hosts:
        host = raw.strip().lower().rstrip(".")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        try:
            host = str(ipaddress.ip_address(host))
        except ValueError:
            if len(host) > 253 or not _HOST_NAME.fullmatch(host):
                raise ConfigError(f"test_hosts: {raw[:80]!r} is not a host name or IP "
                                  "address (no scheme, port or path)") from None
        if host not in out:
            out.append(host)
    return tuple(out)


def _str_map(data: Mapping[str, Any], key: str) -> Mapping[str, str]:
    value = data[key]
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{key} must be an object of strings")
    return value


@dataclass(frozen=True, slots=True)
class Endpoint:
    endpoint_id: str
    app_id: str
    url: str
    event_types: frozenset[str]
    provider: str = "v3"
    method: str = "POST"
    enabled: bool = True
    concurrency: int = 4
    secrets: tuple[SigningSecret, ...] = ()
    config: EndpointConfig = field(default_factory=EndpointConfig)
    config_error: str | None = None  # stored config no longer parses: deliveries render_failed
    # Disabled by the platform (auto-disable): deliveries are parked (held) until re-enabled.
    disabled_at_ms: int | None = None

    def subscribes(self, app_id: str, event_type: str) -> bool:
        return self.enabled and self.app_id == app_id and (
            "*" in self.event_types or event_type in self.event_types
        )


def active_keys(endpoint: Endpoint, now_ms: int) -> list[bytes]:
    """Keys to sign with now: every secret whose window contains ``now`` (two in rotation)."""
    return [s.key for s in endpoint.secrets if s.active_at(now_ms)]
