"""The config change counters (migration 0003) against PostgreSQL: a write to endpoints,
secrets or anomaly settings moves its counter, visible only when the writer commits; and
two config writers queue on the counter instead of deadlocking on each other's rows."""

from __future__ import annotations

import threading

import psycopg

from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for


def _version(settings: Settings, name: str) -> int:
    with connect(settings.database_url) as conn:
        row = conn.execute("SELECT version FROM config_versions WHERE name = %s",
                           (name,)).fetchone()
    assert row is not None
    return int(row[0])


def test_a_config_write_moves_its_counter_when_it_commits(settings: Settings,
                                                          namespace: str) -> None:
    ep = f"ep_{namespace}_v"
    before, other = _version(settings, "endpoints"), _version(settings, "payout_anomaly_settings")
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{namespace}", url="https://a.example/")
        assert _version(settings, "endpoints") == before  # not committed: not seen
        conn.commit()
    after = _version(settings, "endpoints")
    assert after > before
    with connect(settings.database_url) as conn:
        conn.execute("DELETE FROM endpoint_secrets WHERE endpoint_id = %s", (ep,))
        conn.commit()
    assert _version(settings, "endpoints") > after  # a secret statement counts too
    assert _version(settings, "payout_anomaly_settings") == other  # the other counter stays


def test_config_writers_queue_instead_of_deadlocking(settings: Settings,
                                                     namespace: str) -> None:
    x, y = f"ep_{namespace}_x", f"ep_{namespace}_y"
    with connect(settings.database_url) as conn:
        for ep in (x, y):
            upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{namespace}",
                            url="https://a.example/")
        conn.commit()
    rename = "UPDATE endpoints SET name = %s WHERE endpoint_id = %s"
    t1 = connect(settings.database_url)
    t1.execute("SET lock_timeout = '20s'")
    t1.execute(rename, ("t1", x))  # T1 holds x and the counter
    errors: list[BaseException] = []
    second_started = threading.Event()

    def t2() -> None:
        try:
            with connect(settings.database_url) as c:
                c.execute("SET lock_timeout = '20s'")
                second_started.set()
                c.execute(rename, ("t2", y))  # waits for the counter before touching y
                c.commit()
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=t2)
    th.start()
    second_started.wait(10)
    with connect(settings.database_url, autocommit=True) as probe:  # T2 waits on T1
        wait_for(lambda: probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE 'UPDATE endpoints SET name%%'").fetchone() == (1,), 10,
            interval=0.02, what="the second writer waiting on the first")
    try:
        t1.execute(rename, ("t1", y))  # with an AFTER trigger T2 would hold y: a deadlock
        t1.commit()
    except psycopg.errors.DeadlockDetected as exc:  # pragma: no cover - the failure shown
        raise AssertionError("config writers deadlocked") from exc
    finally:
        t1.close()
    th.join(30)
    assert not errors, errors
    with connect(settings.database_url) as conn:
        names = dict(conn.execute("SELECT endpoint_id, name FROM endpoints"
                                  " WHERE endpoint_id = ANY(%s)", ([x, y],)).fetchall())
    assert names == {x: "t1", y: "t2"}  # T2 went second, after T1's commit
