"""The engine benchmark's check that every delivery of its run is on record (bench/engine.py):
against PostgreSQL, it counts only this run's rows that were delivered with their attempt
counted, and fails the run when one is missing."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from bench.engine import _check_on_record
from postbacks.db.connect import connect
from postbacks.settings import Settings

SINCE_MS = 1_760_000_000_000


def _insert(conn: psycopg.Connection[Any], ns: str, name: str, *, at_ms: int, status: str,
            attempts: int) -> None:
    conn.execute(
        "INSERT INTO deliveries (delivery_id, endpoint_id, app_id, conversion_id, event_type,"
        " event_id, idempotency_key, snapshot, created_at, status, attempt_count)"
        " VALUES (%s, %s, 'app', %s, 'conversion', 'evt', 'msg', '{}', %s, %s, %s)",
        (f"dlv_{ns}_{name}", f"ep_{ns}", f"cv_{ns}_{name}",
         dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC), status, attempts))


def test_the_run_fails_unless_each_of_its_deliveries_is_on_record(
        settings: Settings, namespace: str) -> None:
    with connect(settings.database_url, autocommit=True) as db:
        _insert(db, namespace, "a", at_ms=SINCE_MS, status="delivered", attempts=1)
        _insert(db, namespace, "b", at_ms=SINCE_MS + 5, status="delivered", attempts=2)
        # not counted: still pending, no attempt counted, an earlier run's row
        _insert(db, namespace, "c", at_ms=SINCE_MS + 9, status="pending", attempts=0)
        _insert(db, namespace, "d", at_ms=SINCE_MS + 9, status="delivered", attempts=0)
        _insert(db, namespace, "e", at_ms=SINCE_MS - 1, status="delivered", attempts=1)

        _check_on_record(settings, db, [f"ep_{namespace}"], SINCE_MS, 2)
        with pytest.raises(RuntimeError, match="only 2 of 3 deliveries are on record"):
            _check_on_record(settings, db, [f"ep_{namespace}"], SINCE_MS, 3)
        with pytest.raises(RuntimeError, match="only 0 of 1 deliveries"):
            _check_on_record(settings, db, [f"ep_{namespace}_other"], SINCE_MS, 1)
