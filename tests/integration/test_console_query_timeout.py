"""A console page whose query runs too long is cancelled and answered, not left holding
one of the console's few connections (and its locks on the tables the sink writes) for
minutes; the pool's connections carry keepalives, so a server gone without a word fails
a request in about 30 s, not after the kernel's ~15 minutes."""

from __future__ import annotations

import psycopg
import pytest

from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from replay_console.pool import ConnPool
from tests.integration.console_util import Client, console_server, token


def test_a_statement_past_the_pools_timeout_is_cancelled(settings: Settings) -> None:
    pool = ConnPool(settings.database_url, statement_timeout_ms=200)
    with pytest.raises(psycopg.errors.QueryCanceled):
        pool.call(lambda conn: conn.execute("SELECT pg_sleep(3)").fetchone())
    assert pool.call(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)  # goes on

    def settings_of(conn: psycopg.Connection) -> tuple[str, str, str]:  # type: ignore[type-arg]
        row = conn.execute("SELECT current_setting('statement_timeout')").fetchone()
        assert row is not None
        params = conn.info.get_parameters()  # the client side's connection options
        return str(row[0]), params.get("keepalives", ""), params.get("tcp_user_timeout", "")

    assert pool.call(settings_of) == ("200ms", "1", "30000")


def test_a_page_whose_query_is_cancelled_says_so(settings: Settings, namespace: str) -> None:
    bearer = token(settings, f"sup-{namespace}", "support")
    # 1 ms: the first query of the page is cancelled
    with console_server(settings, pool=ConnPool(settings.database_url,
                                                statement_timeout_ms=1)) as port:
        r = Client(port, bearer=bearer).get("/api/v1/deliveries?q=dlv_x")
    assert r.status == 503
    assert "ran over 0.001 s and was cancelled: narrow it" in r.json()["error"]


def test_one_actors_slow_searches_leave_the_console_to_everyone_else(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four slow searches of one token (each holding a connection until its statement
    timeout) took every connection of the pool, and every other user's requests, sign-in
    checks included, waited behind them. One actor has at most two requests running; the
    rest are answered 429 at once, and credentials are checked on connections of their
    own."""
    import threading
    import time

    from replay_console import queries as q

    real = q.list_deliveries
    slow_actor = f"support:slow-{namespace}"

    def list_deliveries(conn: psycopg.Connection, p, flt):  # type: ignore[no-untyped-def,type-arg]
        if p.actor == slow_actor:
            conn.execute("SELECT pg_sleep(4)")
        return real(conn, p, flt)

    monkeypatch.setattr(q, "list_deliveries", list_deliveries)
    slow = Client(0, bearer=token(settings, f"slow-{namespace}", "support"))
    other = token(settings, f"other-{namespace}", "support")
    with console_server(settings) as port:
        slow.port = port
        answers: list[int] = []
        threads = [threading.Thread(target=lambda: answers.append(
            slow.get("/api/v1/deliveries?limit=1").status)) for _ in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: answers.count(429) == 2, 10, interval=0.01,
                 what="two of the four refused (the other two in PostgreSQL)",
                 progress=lambda: answers)
        started = time.monotonic()
        for _ in range(3):  # another user, and a new sign-in each time
            assert Client(port, bearer=other).get("/api/v1/deliveries?limit=1").status == 200
        waited = time.monotonic() - started
        for t in threads:
            t.join(30)
    assert sorted(answers) == [200, 200, 429, 429], answers
    assert waited < 2.5, f"another user waited {waited:.1f} s behind the slow searches"
