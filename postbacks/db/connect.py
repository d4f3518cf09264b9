"""Connections with a clear error when PostgreSQL is not there."""

from __future__ import annotations

from typing import Any

import psycopg

from postbacks.errors import ServiceUnavailable

__all__ = ["connect"]


# A connection held open between uses (the background refreshers): TCP keepalives and a
# TCP user timeout, so a server that vanished without closing the connection fails the
# next query within ~30 s instead of the kernel's ~15 minutes of retransmissions.
_KEPT: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                         "keepalives_count": 3, "tcp_user_timeout": 30_000}


def connect(database_url: str, *, autocommit: bool = False,
            kept: bool = False) -> psycopg.Connection:
    try:
        return psycopg.connect(database_url, autocommit=autocommit, connect_timeout=10,
                               **(_KEPT if kept else {}))
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
