"""The group watch against the real broker: an unassigned consumer whose group the broker
shows empty is restarted (here: reported); an idle member of a live group is not."""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import Consumer

from postbacks.kafka.watchdog import watch_membership
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
