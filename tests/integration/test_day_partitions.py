"""The coming week's daily partitions are made again each UTC day on the sink's long-lived
connection. They were made only when the sink connected, so a sink up for a week wrote
every later day into the default partitions, which retention never drops. Making them
waits behind no long query: under a lock held elsewhere it gives up after its lock timeout
and tries again later, and the write goes on.

The days are far in the future (no other test writes there); the partitions made here are
dropped at the end.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

import pytest

from postbacks.db.connect import connect
from postbacks.db.migrate import DayPartitions
from postbacks.settings import Settings

DAY = dt.date(2091, 3, 10)


def _made(url: str, since: dt.date) -> set[str]:
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " JOIN pg_class p ON p.oid = i.inhparent"
            " WHERE p.relname IN ('deliveries', 'delivery_attempts')"
            " AND c.relname ~ '_2[0-9]{7}$' AND right(c.relname, 8) >= %s",
            (since.strftime("%Y%m%d"),)).fetchall()
    return {r[0] for r in rows}


@pytest.fixture
def url(settings: Settings) -> Iterator[str]:
    yield settings.database_url
    with connect(settings.database_url) as conn:
        for name in _made(settings.database_url, DAY - dt.timedelta(days=1)):
            conn.execute(f'DROP TABLE "{name}"')
        conn.commit()


def test_each_day_makes_the_coming_week_and_a_held_lock_is_waited_out_later(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    today, now = [DAY], [0.0]
    days = DayPartitions(lock_timeout_ms=300, retry_s=60, today=lambda: today[0],
                         clock=lambda: now[0])
    with connect(url) as conn:
        assert days.keep(conn)
        want = {f"{t}_{(DAY + dt.timedelta(days=i)).strftime('%Y%m%d')}"
                for t in ("deliveries", "delivery_attempts") for i in range(-1, 7)}
        assert _made(url, DAY - dt.timedelta(days=1)) == want
        assert days.keep(conn)  # done for the day: no statement

        # a week later, a long reader holds the parent: the sink's write does not wait
        today[0] = DAY + dt.timedelta(days=7)
        with connect(url) as reader:
            reader.execute("SELECT count(*) FROM deliveries WHERE false")  # ACCESS SHARE
            with caplog.at_level(logging.WARNING, logger="postbacks.db.migrate"):
                assert not days.keep(conn)
            assert "could not make the coming days' partitions" in caplog.text
            assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection is usable
            now[0] += 61
            assert not days.keep(conn)  # never inside a transaction it does not own
            conn.commit()
            days = DayPartitions(lock_timeout_ms=300, retry_s=60, today=lambda: today[0],
                                 clock=lambda: now[0])
            assert not days.keep(conn)
            now[0] += 30
            assert not days.keep(conn)  # not before retry_s
            reader.rollback()
        now[0] += 31
        assert days.keep(conn)
        assert f"deliveries_{(DAY + dt.timedelta(days=13)).strftime('%Y%m%d')}" in _made(
            url, DAY)
