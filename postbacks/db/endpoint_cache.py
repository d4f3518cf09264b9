"""A read-mostly view of endpoint config, refreshed from PostgreSQL in the background.

Stages read ``snapshot()`` on the hot path (no database round trip). A refresh failure
keeps the last good view and is logged; the first load must succeed (fail fast at start).
A refresh first reads the endpoints' change counter (``config_versions``, bumped by a
trigger in every transaction writing endpoints or secrets) and reloads (decrypting every
secret) only when it moved: at thousands of endpoints a full load costs tens of ms of
CPU in every stage. (The counter replaced an md5 of every endpoint and secret row: 38 ms
of PostgreSQL per stage and refresh at 1,700 endpoints, growing with them.) The
connection is kept between refreshes (a new one costs a PostgreSQL backend start every
refresh), with TCP keepalives; a query failing on it is retried once on a new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import psycopg

from postbacks.core.endpoint import Endpoint
from postbacks.db.connect import KeptConnection
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import load_endpoints
from postbacks.errors import PostbacksError
from postbacks.metrics import ENDPOINT_VIEW_CHECKED, ENDPOINT_VIEW_FAILURES

__all__ = ["EndpointCache"]

log = logging.getLogger(__name__)

# Bumped in the writer's transaction by a trigger on endpoints and endpoint_secrets
# (migration 0003): any change, a row added or deleted; secrets expiring with time need
# no reload (render checks windows).
_VERSION = "SELECT version FROM config_versions WHERE name = 'endpoints'"
_MIN_GAP_S = 0.5  # between two refreshes, however often one is requested


class EndpointCache:
    def __init__(self, database_url: str, box: SecretBox, refresh_s: float) -> None:
        self._url = database_url
        self._box = box
        self._refresh_s = refresh_s
        self._by_id: Mapping[str, Endpoint] = MappingProxyType({})
        self._by_app: Mapping[str, tuple[Endpoint, ...]] = MappingProxyType({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._version: int | None = None  # config_versions' 'endpoints' at the last load
        self._db = KeptConnection(database_url)
        self._lock = threading.Lock()  # one load at a time on it
        self.loads = 0  # full loads so far (the change counter saved the others)
        self.failed_refreshes = 0
        # When the view was last known current: the wall-clock ms at which the last
        # successful refresh began (a row written before that is in the view).
        self.checked_ms = 0
        self._wake = threading.Event()

    def load(self, if_changed: bool = False) -> None:
        """Load every enabled endpoint; with ``if_changed``, only if a row changed since.

        Called at start and by the refresh thread (a stage meeting an unknown endpoint asks
        it with :meth:`request_refresh`): one at a time (a lock), on the kept connection
        (:class:`KeptConnection`: one retry on a new connection, then
        :class:`ServiceUnavailable`; the view is kept)."""
        with self._lock:
            self._db.run(lambda conn: self._load(conn, if_changed))

    def _load(self, conn: psycopg.Connection[Any], if_changed: bool) -> None:
        began_ms = int(time.time() * 1000)
        row = conn.execute(_VERSION).fetchone()
        version = None if row is None else int(row[0])
        if if_changed and version is not None and version == self._version:
            self.checked_ms = began_ms
            return
        endpoints = load_endpoints(conn, self._box)  # read after it: never older
        self._version = version
        self.loads += 1
        by_app: dict[str, list[Endpoint]] = {}
        for ep in endpoints:
            by_app.setdefault(ep.app_id, []).append(ep)
        self._by_id = MappingProxyType({e.endpoint_id: e for e in endpoints})
        self._by_app = MappingProxyType({k: tuple(v) for k, v in by_app.items()})
        self.checked_ms = began_ms

    def start(self) -> None:
        self.load()
        ENDPOINT_VIEW_CHECKED.set_function(lambda: self.checked_ms / 1000)
        self._thread = threading.Thread(target=self._loop, name="endpoint-cache", daemon=True)
        self._thread.start()

    def request_refresh(self) -> None:
        """Refresh soon, on the refresh thread (a stage met an endpoint its view lacks): the
        caller does not wait, so a database that hangs holds up no event loop."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is None:
            with self._lock:
                self._db.close()  # no refresh thread that could be using it

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._refresh_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.load(if_changed=True)
            except PostbacksError as exc:  # the next refresh reconnects
                self.failed_refreshes += 1
                ENDPOINT_VIEW_FAILURES.inc()
                log.warning("endpoint config refresh failed, keeping last view: %s", exc)
            except Exception:  # never end the refresh thread: the view would freeze
                self.failed_refreshes += 1
                ENDPOINT_VIEW_FAILURES.inc()
                log.exception("endpoint config refresh failed, keeping last view")
            if self._wake.is_set():  # asked again meanwhile: requests coming fast share one
                self._stop.wait(_MIN_GAP_S)  # refresh (the period stays refresh_s)
        with self._lock:
            self._db.close()

    def get(self, endpoint_id: str) -> Endpoint | None:
        return self._by_id.get(endpoint_id)

    def for_app(self, app_id: str) -> tuple[Endpoint, ...]:
        return self._by_app.get(app_id, ())
