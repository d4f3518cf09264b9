"""Endpoint configuration: load for the stages, save for seeding and the console."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret
from postbacks.core.signing import decode_secret
from postbacks.db.crypto import SecretBox
from postbacks.db.times import ms_of
from postbacks.errors import ConfigError
from postbacks.ids import new_id

__all__ = ["add_secret", "end_other_secrets", "load_endpoints", "upsert_endpoint"]

log = logging.getLogger(__name__)


def load_endpoints(conn: psycopg.Connection[Any], box: SecretBox,
                   only: str | None = None) -> list[Endpoint]:
    """Every enabled endpoint (or just ``only``, enabled or not) with its (decrypted)
    secrets that have not expired. A secret that does not open (a row written by hand, or
    sealed under another key) is left out, logged; an endpoint none of whose secrets opens
    gets a ``config_error`` (its deliveries fail to render, loudly) and the other
    endpoints load. When not one secret of a full load opens, the key is wrong and
    :class:`ConfigError` is raised."""
    secrets: dict[str, list[SigningSecret]] = {}
    unopened: dict[str, str] = {}  # endpoint -> why one of its secrets cannot be used
    first: ConfigError | None = None
    one = " AND endpoint_id = %(only)s" if only is not None else ""
    for secret_id, endpoint_id, ciphertext, active_from, active_until in conn.execute(
        "SELECT secret_id, endpoint_id, ciphertext, active_from, active_until"
        " FROM endpoint_secrets WHERE (active_until IS NULL OR active_until > now())"
        f"{one} ORDER BY active_from", {"only": only},
    ):
        try:
            key = decode_secret(box.open(bytes(ciphertext), secret_id))
        except (ConfigError, ValueError) as exc:  # one row written by hand, or mangled
            first = first or ConfigError(f"{exc} (not one signing secret opens)")
            log.warning("endpoint %s: signing secret %s cannot be used (%s); left out",
                        endpoint_id, secret_id, exc)
            unopened.setdefault(endpoint_id, f"signing secret {secret_id} cannot be used "
                                             f"({exc}), and no other of its secrets can: "
                                             "add a new one")
            continue
        secrets.setdefault(endpoint_id, []).append(
            SigningSecret(secret_id, key, ms_of(active_from) or 0, ms_of(active_until))
        )
    if first is not None and not secrets and only is None:
        raise first  # not one secret opens: the key is wrong, not a row
    for endpoint_id in secrets:  # another of its secrets opens: it signs with that one
        unopened.pop(endpoint_id, None)
    out = []
    for row in conn.execute(
        "SELECT endpoint_id, app_id, url, method, provider, event_types, enabled, concurrency,"
        " config, disabled_at FROM endpoints WHERE "
        + ("endpoint_id = %(only)s" if only else "enabled"),
        {"only": only},
    ):
        (endpoint_id, app_id, url, method, provider, event_types, enabled, concurrency, cfg,
         disabled_at) = row
        try:
            config, error = EndpointConfig.from_json(cfg), unopened.get(endpoint_id)
        except ConfigError as exc:
            config, error = EndpointConfig(), f"stored endpoint config is invalid: {exc}"
        out.append(
            Endpoint(
                endpoint_id=endpoint_id, app_id=app_id, url=url, method=method,
                provider=provider, event_types=frozenset(event_types), enabled=enabled,
                concurrency=concurrency, secrets=tuple(secrets.get(endpoint_id, ())),
                config=config, config_error=error, disabled_at_ms=ms_of(disabled_at),
            )
        )
    return out


def upsert_endpoint(
    conn: psycopg.Connection[Any], *, endpoint_id: str, app_id: str, url: str,
    event_types: Sequence[str] = ("*",), provider: str = "v3", concurrency: int = 4,
    name: str = "", method: str = "POST", config: EndpointConfig | None = None,
) -> None:
    cfg = Jsonb((config or EndpointConfig()).to_json())
    conn.execute(
        "INSERT INTO endpoints (endpoint_id, app_id, url, event_types, provider, concurrency,"
        " name, method, config) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (endpoint_id) DO UPDATE SET app_id = EXCLUDED.app_id, url = EXCLUDED.url,"
        " event_types = EXCLUDED.event_types, provider = EXCLUDED.provider,"
        " concurrency = EXCLUDED.concurrency, name = EXCLUDED.name, method = EXCLUDED.method,"
        " config = EXCLUDED.config, updated_at = now()",
        (endpoint_id, app_id, url, list(event_types), provider, concurrency, name, method, cfg),
    )


def add_secret(
    conn: psycopg.Connection[Any], box: SecretBox, endpoint_id: str, secret: str,
    *, active_from: dt.datetime | None = None, active_until: dt.datetime | None = None,
    now_ms: int,
) -> str:
    decode_secret(secret)  # refuse a malformed secret before storing it
    secret_id = new_id("sec", now_ms)
    conn.execute(
        "INSERT INTO endpoint_secrets (secret_id, endpoint_id, ciphertext, active_from,"
        " active_until) VALUES (%s, %s, %s, coalesce(%s, now() - interval '1 minute'), %s)",
        (secret_id, endpoint_id, box.seal(secret, secret_id), active_from, active_until),
    )
    return secret_id


def end_other_secrets(conn: psycopg.Connection[Any], endpoint_id: str, keep_secret_id: str,
                      overlap_s: float) -> list[str]:
    """Rotation: every other open secret of the endpoint stays active ``overlap_s`` more
    (both signatures are sent meanwhile; 0 = ends now). Returns the ids ended. A secret not
    yet active by then is left alone (ending it before it starts is not a window)."""
    return [r[0] for r in conn.execute(
        "UPDATE endpoint_secrets SET active_until = now() + make_interval(secs => %s)"
        " WHERE endpoint_id = %s AND secret_id <> %s"
        " AND active_from < now() + make_interval(secs => %s) AND (active_until IS NULL"
        " OR active_until > now() + make_interval(secs => %s)) RETURNING secret_id",
        (overlap_s, endpoint_id, keep_secret_id, overlap_s, overlap_s))]
