"""Connections with a clear error when PostgreSQL is not there."""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from postbacks.errors import ConfigError, InvalidRecord, ServiceUnavailable
from postbacks.settings import redact_url

__all__ = ["Connection", "DatabaseError", "KeptConnection", "connect", "scratch_database",
           "with_dbname"]

# For modules outside the database layer (psycopg stays fenced in it): what connect()
# returns, and the base of every error PostgreSQL or the driver raises.
Connection: TypeAlias = psycopg.Connection[Any]
DatabaseError = psycopg.Error


# A connection held open between uses (the background refreshers): TCP keepalives and a
# TCP user timeout, so a server that vanished without closing the connection fails the
# next query within ~30 s instead of the kernel's ~15 minutes of retransmissions.
_KEPT: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                         "keepalives_count": 3, "tcp_user_timeout": 30_000}


def connect(database_url: str, *, autocommit: bool = False,
            kept: bool = False) -> psycopg.Connection:
    """A connection; ``kept``: with keepalives (held open between uses)."""
    try:
        return psycopg.connect(database_url, autocommit=autocommit, connect_timeout=10,
                               **(_KEPT if kept else {}))
    except psycopg.OperationalError as exc:
        raise ServiceUnavailable(
            f"PostgreSQL is not reachable at {redact_url(database_url)} (POSTBACKS_DATABASE_URL): "
            f"{_hidden(str(exc), database_url)}. Start it with `make services-up` "
            "(or `bash deploy/local/services.sh up`)."
        ) from exc
    except psycopg.ProgrammingError as exc:  # a URL the driver cannot parse (it quotes it)
        raise ConfigError(f"POSTBACKS_DATABASE_URL {redact_url(database_url)}: "
                          f"{_hidden(str(exc), database_url)}") from None


def _hidden(text: str, database_url: str) -> str:
    """A driver's message with the URL in it redacted."""
    return text.strip().replace(database_url, redact_url(database_url))


T = TypeVar("T")


class KeptConnection:
    """One autocommit connection kept open between uses by a background refresher (a new
    one per pass costs a PostgreSQL backend start). ``run(fn)`` calls ``fn(conn)``; when a
    query fails on the kept connection (the server restarted or dropped it), ``fn`` runs
    once more on a new one, and a second failure drops it and raises
    :class:`ServiceUnavailable`. A value the server refuses (a NUL in a text) raises
    :class:`InvalidRecord` at once. One caller at a time (callers serialize)."""

    def __init__(self, database_url: str) -> None:
        self._url = database_url
        self.conn: psycopg.Connection[Any] | None = None

    def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        for last in (False, True):
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = connect(self._url, autocommit=True, kept=True)
                return fn(self.conn)
            except (psycopg.DataError, psycopg.errors.ProgramLimitExceeded) as exc:
                # the query's values, not the server: trying again cannot help (a NUL in a
                # record's text waited for ever as "PostgreSQL unavailable")
                raise InvalidRecord(f"PostgreSQL refuses a value: {exc}") from exc
            except psycopg.Error as exc:
                self.close()
                if last:
                    raise ServiceUnavailable(
                        f"PostgreSQL query failed at {redact_url(self._url)}: {exc}") from exc
            except ServiceUnavailable:  # no new connection
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to release
                conn.close()


def with_dbname(url: str, name: str) -> str:
    """``url`` naming database ``name``; a ``postgresql://`` URL stays one (the stages'
    settings accept only URLs)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("postgresql", "postgres"):
        return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))
    return make_conninfo(url, dbname=name)


@contextlib.contextmanager
def scratch_database(base_url: str, suffix: str) -> Iterator[str]:
    """An empty database ``<base name>_<suffix>`` on ``base_url``'s server (one left by an
    earlier run is dropped first); its URL. Dropped on exit, its sessions ended."""
    name = f"{conninfo_to_dict(base_url).get('dbname') or 'postbacks'}_{suffix}"
    with connect(with_dbname(base_url, "postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield with_dbname(base_url, name)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
