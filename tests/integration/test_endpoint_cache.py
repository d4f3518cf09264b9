"""The stages' endpoint cache reloads when, and only when, an endpoint or secret row changed."""

from __future__ import annotations

import time

import pytest

from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoint_cache import EndpointCache
from postbacks.db.endpoints import add_secret, upsert_endpoint
from postbacks.errors import ServiceUnavailable
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for


def test_refresh_reloads_only_after_a_change(settings: Settings, namespace: str) -> None:
    box = SecretBox(settings.secrets_key.reveal())
    ep, app = f"ep_{namespace}_cache", f"app_{namespace}"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url="https://a.example/")
        conn.commit()
    cache = EndpointCache(settings.database_url, box, refresh_s=3600)
    cache.load()
    first = cache.get(ep)
    assert first is not None and first.url == "https://a.example/"
    assert cache.loads == 1

    cache.load(if_changed=True)  # nothing changed: the counter says so, no full load
    assert cache.loads == 1 and cache.get(ep) is first

    with connect(settings.database_url) as conn:  # an edit of any column
        conn.execute("UPDATE endpoints SET url = 'https://b.example/' WHERE endpoint_id = %s",
                     (ep,))
        conn.commit()
    cache.load(if_changed=True)
    assert cache.loads == 2
    changed = cache.get(ep)
    assert changed is not None and changed.url == "https://b.example/"

    with connect(settings.database_url) as conn:  # a secret added (rotation)
        add_secret(conn, box, ep, generate_secret(), now_ms=int(time.time() * 1000))
        conn.commit()
    cache.load(if_changed=True)
    assert cache.loads == 3
    rotated = cache.get(ep)
    assert rotated is not None and len(rotated.secrets) == len(changed.secrets) + 1

    with connect(settings.database_url) as conn:  # disabled: gone from the stages' view
        conn.execute("UPDATE endpoints SET enabled = false WHERE endpoint_id = %s", (ep,))
        conn.commit()
    cache.load(if_changed=True)
    assert cache.loads == 4 and cache.get(ep) is None and cache.for_app(app) == ()


def test_a_dropped_connection_is_replaced_and_the_refresh_thread_survives(
        settings: Settings, namespace: str) -> None:
    box = SecretBox(settings.secrets_key.reveal())
    ep = f"ep_{namespace}_drop"
    cache = EndpointCache(settings.database_url, box, refresh_s=0.05)
    cache.start()
    try:
        conn = cache._db.conn
        assert conn is not None
        pid = conn.info.backend_pid
        _terminate(settings, pid)  # the server drops the kept connection
        _add(settings, ep, namespace, "https://c.example/")
        cache.load(if_changed=True)  # retried on a new connection: the change is seen
        assert cache.get(ep) is not None
        assert cache._db.conn is not None and cache._db.conn.info.backend_pid != pid

        # the connection dropped and no new one possible: a clear error, the view kept,
        # and the refresh thread keeps going until PostgreSQL is back
        cache._db._url = "postgresql://postbacks@127.0.0.1:9/postbacks"  # before: the
        _terminate(settings, cache._db.conn.info.backend_pid)  # thread may reconnect first
        with pytest.raises(ServiceUnavailable):
            cache.load(if_changed=True)
        assert cache.get(ep) is not None
        failed = cache.failed_refreshes
        wait_for(lambda: cache.failed_refreshes >= failed + 3, 30, interval=0.02,
                 what="three failed refreshes")
        assert cache._thread is not None and cache._thread.is_alive()
        cache._db._url = settings.database_url
        ep2 = f"ep_{namespace}_back"
        _add(settings, ep2, namespace, "https://d.example/")
        wait_for(lambda: cache.get(ep2) is not None, 10, interval=0.05,
                 what="the refresh thread picking up the change")
    finally:
        cache.stop()


def _terminate(settings: Settings, pid: int) -> None:
    with connect(settings.database_url, autocommit=True) as admin:
        # with a timeout, it returns once the backend is gone (not just signalled)
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))


def _add(settings: Settings, ep: str, namespace: str, url: str) -> None:
    with connect(settings.database_url) as c:
        upsert_endpoint(c, endpoint_id=ep, app_id=f"app_{namespace}", url=url)
        c.commit()
