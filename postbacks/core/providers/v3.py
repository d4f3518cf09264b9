"""V3: POST of a flat, canonical, typed, versioned JSON envelope, Standard Webhooks signed.

Envelope (serialized with orjson; the signature covers these exact bytes)::

    {"schema_version": N, "type": <event_type>, "id": <idempotency_key>, "data": {...}}

Versioning policy. Each endpoint is pinned to a ``schema_version``. Within a version
every field keeps its name and type forever; a type or structure change is a new version
(version 2 exists because ``occurred_at`` changed from epoch ms to an ISO-8601 string).
Additive fields join the newest version *off by default*: an endpoint receives them only
if it lists them in ``fields``, so adding a field never changes what an existing
publisher gets.

* Version 1: conversion_id, app_id, event_type, goal_id (nullable), payout_usd (decimal
  string, 6 places, nullable), occurred_at (epoch ms) — all on by default.
* Version 2: the same six, with occurred_at as UTC ISO-8601; opt-in payout_usd_micros
  (integer, nullable), source_completed_at / source_created_at (UTC ISO-8601 like every
  version-2 timestamp, nullable), currency (the original currency, else "USD").

Per endpoint, ``fields`` is an explicit subset (each must exist in the pinned version)
and ``aliases`` renames a canonical field to the key sent. Keys are emitted in canonical
order whatever order ``fields`` lists them in, so reordering config never changes bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import orjson

from postbacks.core.endpoint import Endpoint, EndpointConfig
from postbacks.core.macros import RenderError, format_usd_micros, iso_utc
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
)
from postbacks.records import DeliveryRecord

__all__ = [
    "SCHEMAS",
    "CanonicalField",
    "V3Provider",
    "field_problems",
    "schema_fields",
    "select_fields",
]

Scalar = str | int | None


@dataclass(frozen=True, slots=True)
class CanonicalField:
    name: str
    resolve: Callable[[DeliveryRecord], Scalar]
    default: bool = True  # sent when the endpoint lists no ``fields``


def _payout_usd(d: DeliveryRecord) -> Scalar:
    micros = d["conversion"]["payout_usd_micros"]
    return None if micros is None else format_usd_micros(micros)


def _iso_or_none(ms: int | None) -> Scalar:
    return None if ms is None else iso_utc(ms)


_IDENTITY = (
    CanonicalField("conversion_id", lambda d: d["conversion"]["conversion_id"]),
    CanonicalField("app_id", lambda d: d["conversion"]["app_id"]),
    CanonicalField("event_type", lambda d: d["conversion"]["event_type"]),
    CanonicalField("goal_id", lambda d: d["conversion"]["goal_id"]),
    CanonicalField("payout_usd", _payout_usd),
)

SCHEMAS: Mapping[int, tuple[CanonicalField, ...]] = MappingProxyType({
    1: (*_IDENTITY, CanonicalField("occurred_at", lambda d: d["conversion"]["occurred_at"])),
    2: (
        *_IDENTITY,
        CanonicalField("occurred_at", lambda d: iso_utc(d["conversion"]["occurred_at"])),
        CanonicalField("payout_usd_micros", lambda d: d["conversion"]["payout_usd_micros"],
                       default=False),
        CanonicalField("source_completed_at",
                       lambda d: _iso_or_none(d["conversion"]["source_completed_at"]),
                       default=False),
        CanonicalField("source_created_at",
                       lambda d: _iso_or_none(d["conversion"]["source_created_at"]),
                       default=False),
        CanonicalField("currency", lambda d: d["conversion"]["original_currency"] or "USD",
                       default=False),
    ),
})
"""Canonical fields per schema version, in the order they are sent."""


def schema_fields(version: int) -> tuple[CanonicalField, ...]:
    """The canonical fields of ``version``; :class:`RenderError` if it does not exist."""
    try:
        return SCHEMAS[version]
    except KeyError:
        known = ", ".join(str(v) for v in SCHEMAS)
        raise RenderError(f"unknown schema_version {version} (known: {known})") from None


def field_problems(
    config: EndpointConfig, version: int, *, reserved_keys: Iterable[str] = ()
) -> list[str]:
    """Problems with ``fields``/``aliases`` against ``version`` ([] = fine).

    ``reserved_keys`` are keys the provider adds itself, which no field may be sent as.
    """
    try:
        schema = schema_fields(version)
    except RenderError as exc:
        return [str(exc)]
    known = {f.name for f in schema}
    problems: list[str] = []
    if config.fields is not None:
        if not config.fields:
            problems.append("fields is empty: the payload would carry no data")
        seen: set[str] = set()
        for name in config.fields:
            if name not in known:
                problems.append(f"field {name!r} is not in schema version {version}")
            elif name in seen:
                problems.append(f"field {name!r} is listed twice")
            seen.add(name)
    for name, key in config.aliases.items():
        if name not in known:
            problems.append(f"alias for unknown field {name!r} (schema version {version})")
        if not key.strip():
            problems.append(f"alias for field {name!r} is empty")
    sent_as: dict[str, str] = {k: "(provider)" for k in reserved_keys}
    for f in _selected(schema, config):
        key = config.aliases.get(f.name, f.name)
        if key in sent_as:
            problems.append(f"fields {sent_as[key]!r} and {f.name!r} would both be sent as {key!r}")
        else:
            sent_as[key] = f.name
    return problems


def _selected(schema: tuple[CanonicalField, ...], config: EndpointConfig) -> list[CanonicalField]:
    if config.fields is None:
        return [f for f in schema if f.default]
    wanted = set(config.fields)
    return [f for f in schema if f.name in wanted]


# Validated (sent key, field) plans per endpoint config object: rendering re-uses them
# instead of re-validating the config on every delivery. Keyed by identity; an endpoint
# reload brings new config objects (and a fresh plan).
_PLANS: dict[tuple[int, int, tuple[str, ...]], tuple[EndpointConfig, list[tuple[str, Any]]]] = {}


def _plan(config: EndpointConfig, version: int,
          reserved_keys: tuple[str, ...]) -> list[tuple[str, Any]]:
    key = (id(config), version, reserved_keys)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is config:
        return hit[1]
    problems = field_problems(config, version, reserved_keys=reserved_keys)
    if problems:
        raise RenderError("; ".join(problems))
    plan = [(config.aliases.get(f.name, f.name), f)
            for f in _selected(schema_fields(version), config)]
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[key] = (config, plan)
    return plan


def select_fields(
    d: DeliveryRecord, config: EndpointConfig, version: int,
    *, reserved_keys: Iterable[str] = (),
) -> list[tuple[str, Scalar]]:
    """``(sent key, value)`` of the endpoint's fields; :class:`RenderError` on bad config."""
    return [(key, f.resolve(d)) for key, f in _plan(config, version, tuple(reserved_keys))]


class V3Provider(Provider):
    """POST JSON envelope; see the module docstring for the schema policy."""

    name = "v3"
    reserved_headers = DELIVERY_HEADERS | STANDARD_WEBHOOK_HEADERS | {"content-type"}

    def check_config(self, endpoint: Endpoint) -> list[str]:
        return super().check_config(endpoint) + field_problems(
            endpoint.config, endpoint.config.schema_version
        )

    def render(self, d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
        version = endpoint.config.schema_version
        data = dict(select_fields(d, endpoint.config, version))
        keys = require_active_keys(endpoint, now_ms)
        body = orjson.dumps({
            "schema_version": version,
            "type": d["conversion"]["event_type"],
            "id": d["idempotency_key"],
            "data": data,
        })
        headers = {
            "content-type": "application/json",
            **standard_webhook_headers(d, keys, body, now_ms=now_ms),
            **delivery_headers(d),
        }
        headers = merge_custom_headers(headers, endpoint, self.reserved_headers)
        return RenderedRequest("POST", endpoint.url, headers, body)


register(V3Provider())
