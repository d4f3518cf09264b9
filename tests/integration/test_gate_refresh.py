"""The gate's settings refresher: one round trip per pass on a kept connection, a full read
only when a settings row changed, a broken connection replaced on the next pass."""

from __future__ import annotations

from typing import Any

import pytest

from postbacks.core.anomaly import Mode
from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.streams.anomaly_gate.config import HaltBook
from postbacks.streams.anomaly_gate.refresh import Refresher


def _set(settings: Settings, ep: str, mode: str) -> None:
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="endpoint", scope_key=ep, detector="value_rate", mode=mode,
                 actor="test")
        conn.commit()


def _mode(got: Any, ep: str) -> Mode:
    assert len(got) == 4, f"expected a full snapshot, got {got!r}"
    return got[0].modes(ep).endpoint_rate  # type: ignore[no-any-return]


def test_reads_rows_only_after_a_change_and_survives_a_dropped_connection(
        settings: Settings, namespace: str) -> None:
    ep = f"ep_{namespace}_refresh"
    _set(settings, ep, "detect")
    refresher = Refresher.load(settings)
    assert refresher.apply_initial(HaltBook()).modes(ep).endpoint_rate is Mode.DETECT

    unchanged = refresher.read_changed()  # nothing changed: only the held figures
    assert len(unchanged) == 2 and refresher.loads == 0
    depth, _oldest = unchanged  # type: ignore[misc]
    assert isinstance(depth, int) and depth >= 0

    _set(settings, ep, "enforce")
    assert _mode(refresher.read_changed(), ep) is Mode.ENFORCE and refresher.loads == 1
    assert len(refresher.read_changed()) == 2 and refresher.loads == 1

    conn = refresher._conn
    assert conn is not None
    pid = conn.info.backend_pid
    with connect(settings.database_url, autocommit=True) as admin:  # the server drops it
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(Exception):  # noqa: B017 - whatever psycopg raises for a dead socket
        refresher.read_changed()
    assert refresher._conn is None

    _set(settings, ep, "off")  # the next pass opens a new connection and sees the change
    assert _mode(refresher.read_changed(), ep) is Mode.OFF and refresher.loads == 2
    assert refresher._conn is not None and refresher._conn.info.backend_pid != pid
    refresher.close()
