"""PostgreSQL that takes no writes for a while (a standby after a failover, or
``default_transaction_read_only`` set in a disk emergency): the sink waits and then catches
up, at start and mid-run, and the console answers 503. Before, a write refused as read only
(SQLSTATE 25006) ended the sink with a traceback and the console answered 500.

Runs on a database of its own, whose sessions are made read only by
``ALTER DATABASE … SET default_transaction_read_only`` and ended so they reconnect."""

from __future__ import annotations

import dataclasses

import psycopg

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.integration.console_util import Client, console_server, token
from tests.integration.sink_util import (
    delivered_count,
    ordered_producer,
    produce_delivered,
    sink_topics,
)


def _read_only(url: str, admin_url: str, on: bool) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = '
                     + ("on" if on else "off"))
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE datname = %s AND pid <> pg_backend_pid()", (name,))


def test_the_sink_waits_while_postgresql_is_read_only_and_then_catches_up(
        settings: Settings, stack: Stack, namespace: str, own_database: str) -> None:
    ep = f"ep_{namespace}"
    topic = sink_topics(settings)
    p = ordered_producer(settings)
    env = {"POSTBACKS_DATABASE_URL": own_database}

    # read only before the sink starts: it waits instead of exiting
    _read_only(own_database, settings.database_url, True)
    for i in range(10):
        produce_delivered(p, topic, namespace, ep, i)
    assert p.flush(60) == 0
    sink = stack.start("sink", "sink", extra_env=env)
    wait_for(lambda: "read only" in sink.tail(4000), 60, what="the sink waiting on read only",
             progress=lambda: sink.tail(400))
    assert sink.alive()
    _read_only(own_database, settings.database_url, False)
    wait_for(lambda: delivered_count(own_database, ep) == 10, 90, what="10 delivered rows",
             progress=lambda: delivered_count(own_database, ep))

    own = dataclasses.replace(settings, database_url=own_database)
    admin_token = token(own, f"adm-{namespace}", "admin")  # while it takes writes
    # read only mid-run: the flush fails, the sink rewinds and waits, nothing is lost
    _read_only(own_database, settings.database_url, True)
    for i in range(10, 30):
        produce_delivered(p, topic, namespace, ep, i)
    assert p.flush(60) == 0
    wait_for(lambda: "ReadOnlySqlTransaction" in sink.tail(8000)
             or "read-only transaction" in sink.tail(8000), 60,
             what="a write refused as read only", progress=lambda: sink.tail(400))
    with console_server(own) as port:  # a change refused as read only: 503, not 500
        admin = Client(port, bearer=admin_token)
        r = admin.post("/api/v1/endpoints", body={"app_id": f"app_{namespace}",
                                                  "url": "https://93.184.216.34/hook"})
        assert r.status == 503 and "read only" in r.json()["error"], r.text
    assert sink.alive()
    _read_only(own_database, settings.database_url, False)
    wait_for(lambda: delivered_count(own_database, ep) == 30, 90, what="30 delivered rows",
             progress=lambda: delivered_count(own_database, ep))
    assert sink.alive()
    assert "Traceback" not in sink.tail(20000), sink.tail(4000)
