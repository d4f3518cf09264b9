"""PostgreSQL that takes a write and never answers (a lock held by someone else, a server
hung without closing the connection): the sink's flush is guarded like a Kafka call, so
after ``POSTBACKS_STALL_RESTART_S`` the sink restarts in place (counted in
``postbacks_restarts_in_place_total``) and, once PostgreSQL answers, catches up with
nothing lost. Before, it waited for ever while its /metrics answered as if all were well.

Runs on a database of its own, whose ``deliveries`` table a transaction of the test locks."""

from __future__ import annotations

import re

import psycopg

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.integration.sink_util import (
    delivered_count,
    ordered_producer,
    produce_delivered,
    sink_topics,
)


def _restarts(page: str) -> float:
    got = re.search(r"^postbacks_restarts_in_place_total (\S+)$", page, re.M)
    return float(got.group(1)) if got else 0.0


def test_a_hung_flush_restarts_the_sink_which_then_catches_up(
        settings: Settings, stack: Stack, namespace: str, own_database: str) -> None:
    ep = f"ep_{namespace}"
    topic = sink_topics(settings)
    p = ordered_producer(settings)
    sink = stack.start("sink", "sink", extra_env={"POSTBACKS_DATABASE_URL": own_database,
                                                  "POSTBACKS_STALL_RESTART_S": "8"})
    for i in range(5):
        produce_delivered(p, topic, namespace, ep, i)
    assert p.flush(60) == 0
    wait_for(lambda: delivered_count(own_database, ep) == 5, 90, what="5 delivered rows",
             progress=lambda: delivered_count(own_database, ep))

    with psycopg.connect(own_database) as holder:  # every write to deliveries waits
        holder.execute("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE")
        for i in range(5, 15):
            produce_delivered(p, topic, namespace, ep, i)
        assert p.flush(60) == 0
        wait_for(lambda: "restarting in place" in sink.tail(20000), 60,
                 what="the sink restarting on its hung flush", progress=lambda: sink.tail(400))
        assert "sink flush has not returned" in sink.tail(20000), sink.tail(4000)
        holder.rollback()  # PostgreSQL answers again
    wait_for(lambda: delivered_count(own_database, ep) == 15, 120, what="15 delivered rows",
             progress=lambda: delivered_count(own_database, ep))
    wait_for(lambda: _restarts(sink.metrics() or "") >= 1, 30,
             what="the restart counted on /metrics")
    assert sink.alive()
