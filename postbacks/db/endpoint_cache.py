"""A read-mostly view of endpoint config, refreshed from PostgreSQL in the background.

Stages read ``snapshot()`` on the hot path (no database round trip). A refresh failure
keeps the last good view and is logged; the first load must succeed (fail fast at start).
A refresh first asks PostgreSQL for a digest of every endpoint and secret row and reloads
(decrypting every secret) only when it changed: at thousands of endpoints a full load
costs tens of ms of CPU in every stage, the digest about one. The connection is kept
between refreshes (a new one costs a PostgreSQL backend start every refresh), with TCP
keepalives; a query failing on it is retried once on a new connection.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import psycopg

from postbacks.core.endpoint import Endpoint
from postbacks.db.connect import KeptConnection
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import load_endpoints
from postbacks.errors import PostbacksError

__all__ = ["EndpointCache"]

log = logging.getLogger(__name__)

# Whole rows, so any change to an endpoint or a secret (any column, a row added or
# deleted) changes it; secrets expiring with time need no reload (render checks windows).
_DIGEST = (
    "SELECT (SELECT md5(coalesce(string_agg(e::text, '|' ORDER BY e.endpoint_id), ''))"
    " FROM endpoints e),"
    " (SELECT md5(coalesce(string_agg(s::text, '|' ORDER BY s.secret_id), ''))"
    " FROM endpoint_secrets s)"
)


class EndpointCache:
    def __init__(self, database_url: str, box: SecretBox, refresh_s: float) -> None:
        self._url = database_url
        self._box = box
        self._refresh_s = refresh_s
        self._by_id: Mapping[str, Endpoint] = MappingProxyType({})
        self._by_app: Mapping[str, tuple[Endpoint, ...]] = MappingProxyType({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._digest: tuple[str, str] | None = None
        self._db = KeptConnection(database_url)
        self._lock = threading.Lock()  # one load at a time on it
        self.loads = 0  # full loads so far (the digest saved the others)
        self.failed_refreshes = 0

    def load(self, if_changed: bool = False) -> None:
        """Load every enabled endpoint; with ``if_changed``, only if a row changed since.

        Called by the refresh thread and by a stage meeting an unknown endpoint (its own
        thread): one at a time (a lock), on the kept connection (:class:`KeptConnection`:
        one retry on a new connection, then :class:`ServiceUnavailable`; the view is
        kept)."""
        with self._lock:
            self._db.run(lambda conn: self._load(conn, if_changed))

    def _load(self, conn: psycopg.Connection[Any], if_changed: bool) -> None:
        row = conn.execute(_DIGEST).fetchone()
        digest = None if row is None else (str(row[0]), str(row[1]))
        if if_changed and digest is not None and digest == self._digest:
            return
        endpoints = load_endpoints(conn, self._box)
        self._digest = digest
        self.loads += 1
        by_app: dict[str, list[Endpoint]] = {}
        for ep in endpoints:
            by_app.setdefault(ep.app_id, []).append(ep)
        self._by_id = MappingProxyType({e.endpoint_id: e for e in endpoints})
        self._by_app = MappingProxyType({k: tuple(v) for k, v in by_app.items()})

    def start(self) -> None:
        self.load()
        self._thread = threading.Thread(target=self._loop, name="endpoint-cache", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is None:
            with self._lock:
                self._db.close()  # no refresh thread that could be using it

    def _loop(self) -> None:
        while not self._stop.wait(self._refresh_s):
            try:
                self.load(if_changed=True)
            except PostbacksError as exc:  # the next refresh reconnects
                self.failed_refreshes += 1
                log.warning("endpoint config refresh failed, keeping last view: %s", exc)
            except Exception:  # never end the refresh thread: the view would freeze
                self.failed_refreshes += 1
                log.exception("endpoint config refresh failed, keeping last view")
        with self._lock:
            self._db.close()

    def get(self, endpoint_id: str) -> Endpoint | None:
        return self._by_id.get(endpoint_id)

    def for_app(self, app_id: str) -> tuple[Endpoint, ...]:
        return self._by_app.get(app_id, ())
