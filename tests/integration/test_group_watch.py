"""The group watch against the real broker: an unassigned consumer whose group the broker
shows empty is restarted (here: reported); an idle member of a live group is not; and a
watched subscription (fan-out, relay, agent) keeps the watch's flag through its
rebalance callbacks."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

from confluent_kafka import Consumer

from postbacks.kafka.clients import make_consumer
from postbacks.kafka.watchdog import subscribe_watched, watch_membership
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for


def test_an_empty_group_is_reported_and_an_idle_member_is_not(settings: Settings) -> None:
    bootstrap = settings.kafka_bootstrap_servers
    stop = threading.Event()
    reports: dict[str, list[str]] = {"empty": [], "live": []}
    empty = f"{settings.topic_prefix}watch-empty-{uuid.uuid4().hex[:6]}"
    live = f"{settings.topic_prefix}watch-live-{uuid.uuid4().hex[:6]}"
    # a live group: one member, polling, with nothing to be assigned from a topic of none
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": live,
                       "session.timeout.ms": 6000})
    member.subscribe([settings.topic("deliveries.v1")])
    try:
        wait_for(lambda: member.poll(0.2) is None and member.assignment(), 30,
                 what="the live group's member to be assigned")
        t0 = time.monotonic()
        for name, group in (("empty", empty), ("live", live)):
            watch_membership(bootstrap, group, lambda: False, 1.0, stop,
                             on_orphaned=reports[name].append)
        wait_for(lambda: reports["empty"], 30, interval=0.1, what="the empty group reported")
        assert time.monotonic() - t0 >= 1.0  # not before the limit
        assert f"{empty}: no partition for" in reports["empty"][0]
        until = time.monotonic() + 4
        while time.monotonic() < until:  # the live group: a member, so never reported
            member.poll(0.2)
        assert reports["live"] == []
    finally:
        stop.set()
        member.close()


def test_a_watched_subscription_keeps_its_flag_and_is_reported_once_out_of_its_group(
    settings: Settings,
) -> None:
    s = dataclasses.replace(settings, stall_restart_s=3.0)
    stop = threading.Event()
    reports: list[str] = []
    assigned: list[int] = []
    revoked: list[int] = []
    group = f"watched-{uuid.uuid4().hex[:6]}"
    consumer = make_consumer(s, group)  # its group id: s.topic(group), what the watch asks
    closed = False
    owned = subscribe_watched(consumer, [s.topic("deliveries.v1")], s, group, stop,
                              on_assign=lambda _c, parts: assigned.append(len(parts)),
                              on_revoke=lambda _c, parts: revoked.append(len(parts)),
                              on_orphaned=reports.append)
    try:
        # the caller's callback ran, and the client assigned after it (it did not assign)
        wait_for(lambda: consumer.poll(0.2) is None and consumer.assignment(), 30,
                 what="the watched consumer to be assigned")
        assert assigned and assigned[0] > 0
        assert owned()
        until = time.monotonic() + 4  # past the limit, holding its partitions: no report
        while time.monotonic() < until:
            consumer.poll(0.2)
        assert owned() and reports == []
        consumer.close()  # leaves: its partitions revoked, the group empty
        closed = True
        assert revoked and revoked[0] == assigned[0]
        assert not owned()
        wait_for(lambda: reports, 30, interval=0.1, what="the consumer out of its group")
        assert f"{s.topic(group)}: no partition for" in reports[0]
    finally:
        stop.set()
        if not closed:
            consumer.close()
