"""The monitor's reading of the broker: two groups at different positions on one partition,
a tail of nothing but a transaction marker, and faults that must not stop it."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import REGISTRY

from postbacks.core.backlog import PartitionProgress, backlog_ages, lag_of
from postbacks.errors import ServiceUnavailable
from postbacks.kafka.lag import ProgressReader
from postbacks.monitor import Monitor
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from topics import GROUPS, TOPICS

GATE, SINK = (next(g for g in GROUPS if g.stage == s) for s in ("gate", "sink"))


def _commit(settings: Settings, group: str, topic: str, offset: int) -> None:
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": group,
                  "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def test_each_group_gets_its_own_oldest_record_and_a_marker_tail_is_no_lag(
    settings: Settings,
) -> None:
    topic = settings.topic(TOPICS.deliveries.base)
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "transactional.id": f"test-monitor-{uuid.uuid4().hex[:8]}"})
    p.init_transactions(30)
    p.begin_transaction()
    for age_s in (90, 60, 30):  # offsets 0, 1, 2; the commit marker takes offset 3
        p.produce(topic, b"x", b"ep", partition=0, timestamp=now - age_s * 1000)
    p.commit_transaction(30)
    gate, sink = settings.topic(GATE.base), settings.topic(SINK.base)
    _commit(settings, gate, topic, 1)
    reader = ProgressReader(settings, [GATE, SINK])

    def read(stored: dict[tuple[str, str, int], int] | None) -> list[PartitionProgress]:
        def attempt() -> list[PartitionProgress] | None:
            try:  # a topic this new may still answer "not leader" for a moment
                return reader.read(stored)
            except ServiceUnavailable:
                return None
        got: list[PartitionProgress] = wait_for(attempt, 30, what="a round of the reader")
        return got

    try:
        parts = {(x.group, x.topic, x.partition): x for x in read({(sink, topic, 0): 2})}
        # the marker counts until the peek finds nothing but it
        assert (lag_of(parts[(gate, topic, 0)]), lag_of(parts[(sink, topic, 0)])) == (3, 2)
        ages = backlog_ages(parts.values(), int(time.time() * 1000))
        assert 59 <= ages[(gate, topic)] < 120  # record 1's age, not the sink's record 2
        assert 29 <= ages[(sink, topic)] < 60
        assert ages[(gate, topic)] - ages[(sink, topic)] == pytest.approx(30, abs=1)
        # both groups finished every record: only the marker is left after them
        _commit(settings, gate, topic, 3)
        parts = {(x.group, x.topic, x.partition): x for x in read({(sink, topic, 0): 3})}
        assert (lag_of(parts[(gate, topic, 0)]), lag_of(parts[(sink, topic, 0)])) == (0, 0)
        # the sink's offsets unreadable: its group is left out, the gate's still measured
        assert {x.group for x in read(None)} == {gate}
    finally:
        reader.close()


def _errors(check: str) -> float:
    return REGISTRY.get_sample_value("postbacks_monitor_errors_total", {"check": check}) or 0.0


def test_a_broker_or_database_fault_is_counted_and_the_monitor_goes_on(
    settings: Settings,
) -> None:
    no_db = dataclasses.replace(
        settings, database_url=settings.database_url.rsplit("/", 1)[0] + "/no_such_database")
    reader = ProgressReader(no_db, GROUPS)
    try:
        before = (_errors("kafka"), _errors("gaps"))
        monitor = Monitor(no_db, reader)
        monitor.tick()  # PostgreSQL refuses: both checks fail, nothing raises
        assert (_errors("kafka"), _errors("gaps")) == (before[0] + 1, before[1] + 1)
        assert REGISTRY.get_sample_value("postbacks_database_up") == 0.0  # (the alert's)
        Monitor(settings, reader).tick()  # and back
        assert REGISTRY.get_sample_value("postbacks_database_up") == 1.0
    finally:
        reader.close()
    dead = dataclasses.replace(settings, kafka_bootstrap_servers="127.0.0.1:9")
    silent = ProgressReader(dead, GROUPS, timeout_s=1.0, peek_timeout_s=0.5)
    try:
        with pytest.raises(ServiceUnavailable):
            silent.read({})
    finally:
        silent.close()


def test_the_quarantine_depth_counts_quarantined_deliveries_wherever_they_wait(
        settings: Settings, namespace: str) -> None:
    """``webhook_quarantined_depth`` (alert PostbacksQuarantineDeep) counts deliveries whose
    status is quarantined: the agent puts a divert due over a minute ahead in a retry tier,
    so the relay's lag on quarantine.v1 alone no longer shows them all."""
    from postbacks.db.connect import connect
    from tests.integration.anomaly_helpers import held_delivery, insert_deliveries

    monitor = Monitor(settings, reader=None)  # type: ignore[arg-type]
    monitor._check("quarantine", monitor._quarantine)
    before = REGISTRY.get_sample_value("webhook_quarantined_depth")
    assert before is not None
    rows = [held_delivery(namespace, n, endpoint=f"ep_{namespace}_q") for n in range(3)]
    insert_deliveries(settings, rows, status="quarantined", reason="breaker_open")
    try:
        monitor._check("quarantine", monitor._quarantine)
        assert REGISTRY.get_sample_value("webhook_quarantined_depth") == before + 3
    finally:
        with connect(settings.database_url) as conn:
            conn.execute("UPDATE deliveries SET status = 'delivered' WHERE endpoint_id = %s",
                         (f"ep_{namespace}_q",))
            conn.commit()
