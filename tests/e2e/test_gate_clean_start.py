"""A clean start: the gate on fresh topics starts and runs under load without one ERROR
line (or an overlapping commit timer) in its log, and its changelogs carry the configured
replication even when nothing created them before it started."""

from __future__ import annotations

import re
import time

from confluent_kafka.admin import AdminClient, ConfigResource

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.gate_util import GateFeed
from topics import internal_topics
from topics.admin import verify_topics

# aiokafka/Faust/our own ERROR and CRITICAL records, a traceback, librdkafka's errors
# (syslog levels 0-3 on stderr), and Faust's commit timer running into the next interval.
BAD = re.compile(r" (ERROR|CRITICAL) |Traceback|^%[0-3]\||is overlapping", re.MULTILINE)


def _changelogs(settings: Settings) -> list[str]:
    return [settings.topic(s.base) for s in internal_topics()]


def test_the_gate_starts_on_fresh_topics_and_runs_without_error_lines(
    settings: Settings, stack: Stack,
) -> None:
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    # A deployment whose topics were created without the changelogs: the gate makes them.
    for fut in admin.delete_topics(_changelogs(settings), operation_timeout=30).values():
        fut.result()
    wait_for(lambda: not set(_changelogs(settings)) & set(admin.list_topics(timeout=5).topics),
             30, what="changelogs deleted")

    feed = GateFeed(settings)
    start = feed.hour_ago(weeks=0) + 60_000
    n = 6000
    for i in range(n // 2):  # waiting before the gate starts: a first batch at full size
        feed.send(f"ep_c{i % 60}", start + i, 1_000_000)
    feed.flush()
    gate = stack.start("gate", "gate")
    wait_for(lambda: "gate running" in gate.log_path.read_text(), 60, what="gate running")
    for i in range(n // 2, n):  # and more while it runs
        feed.send(f"ep_c{i % 60}", start + i, 1_000_000)
        if i % 500 == 0:
            time.sleep(0.05)
    feed.wait_outputs(n, timeout=90)
    time.sleep(3 * settings.gate_commit_interval_s + 2)  # commits after the last batch
    assert gate.alive(), gate.tail(60)

    assert verify_topics(settings, internal_topics()) == []  # as registered, replication too
    res = [ConfigResource("topic", t) for t in _changelogs(settings)]
    for fut in admin.describe_configs(res).values():
        conf = fut.result()
        assert conf["min.insync.replicas"].value == str(settings.min_insync_replicas)
        assert conf["cleanup.policy"].value == "compact"

    log = gate.log_path.read_text(errors="replace")
    bad = [line for line in log.splitlines() if BAD.search(line)]
    assert not bad, "\n".join(bad[:20])
