"""A console page whose query runs too long is cancelled and answered, not left holding
one of the console's few connections (and its locks on the tables the sink writes) for
minutes; the pool's connections carry keepalives, so a server gone without a word fails
a request in about 30 s, not after the kernel's ~15 minutes."""

from __future__ import annotations

import psycopg
import pytest

from postbacks.settings import Settings
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
