"""Records retention deleted before a group read them (a stage down longer than the
topic's retention): the client resumes at the log's start and says so only in librdkafka's
log. At the assignment the stage logs each such partition and counts the records in
``postbacks_records_expired_unread_total``; the rest flows. Retention is stood in for by
``delete_records`` (the log's start moved past the group's committed offset)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY

from postbacks.codec import codec_for
from postbacks.errors import ServiceUnavailable
from postbacks.kafka.lag import ProgressReader
from postbacks.monitor import Monitor
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from streams.relay import GROUP, run_relay
from tests.kafka_util import decode, read_topic
from tests.unit.factories import make_delivery
from topics import GROUPS, TOPICS


def test_records_deleted_before_the_group_read_them_are_logged_and_counted(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    topic = settings.topic(TOPICS.retry_tier("5s").base)
    group = settings.topic(GROUP)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    now = int(time.time() * 1000)
    for i in range(10):
        p.produce(topic, codec_for("Delivery").encode(make_delivery(
            delivery_id=f"dlv_exp_{i}", endpoint_id="ep_exp", due_at=now)), b"ep_exp",
            partition=0)
    for i in range(4):  # and 4 on a partition the group never had an offset for
        p.produce(topic, codec_for("Delivery").encode(make_delivery(
            delivery_id=f"dlv_new_{i}", endpoint_id="ep_new", due_at=now)), b"ep_new",
            partition=1)
    assert p.flush(10) == 0
    # the group had read 3 of them when it stopped ...
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": group,
                  "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    c.close()
    # ... and retention deleted the log up to offset 7 meanwhile
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    for f in admin.delete_records([TopicPartition(topic, 0, 7),
                                   TopicPartition(topic, 1, 2)]).values():
        f.result(timeout=30)

    # the monitor sees the loss while the stage is down (the stage, only when it is back)
    monitor = Monitor(settings, ProgressReader(settings, [
        g for g in GROUPS if g.stage == "relay"]))

    def deleted_unread() -> float | None:
        try:
            monitor.publish(monitor.reader.read(None), int(time.time() * 1000))
        except ServiceUnavailable:
            return None
        return REGISTRY.get_sample_value("postbacks_records_deleted_unread",
                                         {"group": group, "topic": topic})

    with caplog.at_level(logging.ERROR, logger="postbacks.monitor"):
        assert wait_for(deleted_unread, 30, what="a round of the monitor") == 4
    assert [r.getMessage() for r in caplog.records if r.name == "postbacks.monitor"] == [
        f"monitor: {group}: 4 record(s) of {topic} deleted by retention past the group's "
        "committed offset: it never read them"]
    caplog.clear()

    def counted() -> float:
        return REGISTRY.get_sample_value("postbacks_records_expired_unread_total",
                                         {"group": group, "topic": topic}) or 0.0

    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(settings, stop), daemon=True)
    with caplog.at_level(logging.WARNING, logger="postbacks.kafka.expired"):
        relay.start()
        try:
            got = [decode("Delivery", m)["delivery_id"]
                   for m in read_topic(settings, TOPICS.dispatch.base, 5)]
            wait_for(lambda: counted() == 4, 30, what="4 records counted as expired unread",
                     progress=counted)
        finally:
            stop.set()
            relay.join(30)
    assert sorted(got) == ["dlv_exp_7", "dlv_exp_8", "dlv_exp_9", "dlv_new_2", "dlv_new_3"]
    # the relay committed past the gap: the monitor's figure is back to 0
    wait_for(lambda: deleted_unread() == 0, 30, what="the monitor's figure back to 0")
    last = REGISTRY.get_sample_value(
        "postbacks_records_expired_unread_last_timestamp_seconds",
        {"group": group, "topic": topic})
    assert last is not None and abs(last - time.time()) < 120  # what the alert reads
    [line] = [r.getMessage() for r in caplog.records
              if r.name == "postbacks.kafka.expired" and r.levelno == logging.ERROR]
    # no offset for partition 1, whose log no longer starts at 0: said, not silent
    [fresh] = [r.getMessage() for r in caplog.records
               if r.name == "postbacks.kafka.expired" and r.levelno == logging.WARNING]
    assert fresh.startswith(f"{topic}[1]: this group has no committed offset, and the log "
                            "starts at 2")
    assert f"{topic}[0]: 4 record(s) deleted by retention" in line
    assert "its position 3, the log now starts at 7" in line
