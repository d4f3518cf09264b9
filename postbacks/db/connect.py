"""Connections with a clear error when PostgreSQL is not there."""

from __future__ import annotations

import psycopg

from postbacks.errors import ServiceUnavailable

__all__ = ["connect"]


def connect(database_url: str, *, autocommit: bool = False) -> psycopg.Connection:
    try:
        return psycopg.connect(database_url, autocommit=autocommit, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(
            f"PostgreSQL is not reachable at {_redact(database_url)} (POSTBACKS_DATABASE_URL): "
            f"{str(exc).strip()}. Start it with `make services-up` "
            "(or `bash deploy/local/services.sh up`)."
        ) from exc


def _redact(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
