"""Connections with a clear error when PostgreSQL is not there."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from postbacks.errors import ServiceUnavailable

__all__ = ["KeptConnection", "connect"]


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


T = TypeVar("T")


class KeptConnection:
    """One autocommit connection kept open between uses by a background refresher (a new
    one per pass costs a PostgreSQL backend start). ``run(fn)`` calls ``fn(conn)``; when a
    query fails on the kept connection (the server restarted or dropped it), ``fn`` runs
    once more on a new one, and a second failure drops it and raises
    :class:`ServiceUnavailable`. One caller at a time (callers serialize)."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self.conn: psycopg.Connection[Any] | None = None

    def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        for last in (False, True):
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = connect(self._url, autocommit=True, kept=True)
                return fn(self.conn)
            except psycopg.Error as exc:
                self.close()
                if last:
                    raise ServiceUnavailable(
                        f"PostgreSQL query failed at {_redact(self._url)}: {exc}") from exc
            except ServiceUnavailable:  # no new connection
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to release
                conn.close()
