"""The gate's settings refresher: one round trip per pass on a kept connection, a full read
only when a settings row changed, a connection the server dropped replaced in the same
pass."""

from __future__ import annotations

from typing import Any

import pytest

from postbacks.core.anomaly import Mode
from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.errors import ServiceUnavailable
from postbacks.settings import Settings
from streams.anomaly_gate.config import HaltBook
from streams.anomaly_gate.refresh import Refresher


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

    conn = refresher._db.conn
    assert conn is not None
    pid = conn.info.backend_pid
    _terminate(settings, pid)  # the server drops the kept connection ...
    _set(settings, ep, "off")
    try:  # ... the pass retries on a new one and sees the change
        assert _mode(refresher.read_changed(), ep) is Mode.OFF and refresher.loads == 2
        assert refresher._db.conn is not None and refresher._db.conn.info.backend_pid != pid

        # both the kept connection and a new one failing: the pass raises, nothing kept
        _terminate(settings, refresher._db.conn.info.backend_pid)
        refresher._db._url = "postgresql://postbacks@127.0.0.1:9/postbacks"
        with pytest.raises(ServiceUnavailable):
            refresher.read_changed()
        assert refresher._db.conn is None
        refresher._db._url = settings.database_url
        assert len(refresher.read_changed()) == 2 and refresher.loads == 2
    finally:
        refresher.close()


def _terminate(settings: Settings, pid: int) -> None:
    with connect(settings.database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
