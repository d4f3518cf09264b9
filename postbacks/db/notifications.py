"""The notifier's PostgreSQL access: notification slots and endpoint look-ups.

A slot is claimed with ``INSERT ... ON CONFLICT DO NOTHING`` (autocommit: the claim is
durable before the batch that notifies it is committed to Kafka). A claim is won when the
row was inserted, or when the row already holds this very event id (the same fact read
again after an aborted batch: it is notified again, under the same deterministic
delivery id and idempotency key).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from postbacks.core.endpoint import Endpoint
from postbacks.core.notify import Slot
from postbacks.db.connect import KeptConnection
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import load_endpoints
from postbacks.errors import ServiceUnavailable

__all__ = ["NotificationStore", "Stopping", "claim_slot", "endpoint_by_id"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Stopping(BaseException):
    """Raised out of a call blocked on PostgreSQL when the stage stops: the batch is
    neither dead-lettered nor committed (a BaseException, so the stage's per-record
    error handling lets it through); it is read again on the next start."""


def _hour(slot: Slot) -> dt.datetime:
    return dt.datetime.fromtimestamp(slot.hour_ms / 1000, dt.UTC)


def claim_slot(conn: psycopg.Connection[Any], slot: Slot, event_id: str) -> bool:
    """True when ``event_id`` holds the slot (claimed now, or by itself before)."""
    params = (slot.endpoint_id, slot.kind, _hour(slot), event_id)
    row = conn.execute(
        "INSERT INTO notifications (endpoint_id, kind, hour, event_id)"
        " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING event_id", params,
    ).fetchone()
    if row is not None:
        return True
    row = conn.execute(
        "SELECT event_id FROM notifications WHERE endpoint_id = %s AND kind = %s"
        " AND hour = %s", params[:3],
    ).fetchone()
    return row is not None and row[0] == event_id


def endpoint_by_id(conn: psycopg.Connection[Any], box: SecretBox,
                   endpoint_id: str) -> Endpoint | None:
    """One endpoint, enabled or not (a disabled endpoint's owner is still told)."""
    found = load_endpoints(conn, box, only=endpoint_id)
    return found[0] if found else None


class NotificationStore:
    """The notifier's kept connection. A PostgreSQL outage is waited out (a notification
    is never dropped for it): each call retries every second until it succeeds, or raises
    :class:`Stopping` once ``stop`` is set."""

    def __init__(self, database_url: str, box: SecretBox, stop: threading.Event) -> None:
        self._db = KeptConnection(database_url)
        self._box = box
        self._stop = stop

    def claim(self, slot: Slot, event_id: str) -> bool:
        return self._run(lambda conn: claim_slot(conn, slot, event_id))

    def endpoint(self, endpoint_id: str) -> Endpoint | None:
        return self._run(lambda conn: endpoint_by_id(conn, self._box, endpoint_id))

    def _run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        while True:
            try:
                return self._db.run(fn)
            except ServiceUnavailable as exc:
                log.warning("notifier: PostgreSQL unavailable, waiting: %s", exc)
                if self._stop.wait(1.0):
                    raise Stopping() from exc

    def close(self) -> None:
        self._db.close()
