"""Topic creation against the real broker checks what exists: partitions, replication,
min.insync.replicas, cleanup policy and retention; drift is named, never passed over."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from postbacks.errors import ConfigError
from postbacks.settings import Settings, load_settings
from topics import TOPICS, all_topics, internal_topics
from topics.admin import TopicDriftError, create_topics, delete_prefixed_topics, verify_topics


@pytest.fixture()
def dev(migrated: dict[str, str], namespace: str) -> Iterator[Settings]:
    s = load_settings({**migrated, "POSTBACKS_KAFKA_REPLICATION": "dev"},
                      topic_prefix=f"{namespace}.drift.")
    yield s
    delete_prefixed_topics(s, s.topic_prefix)


def test_created_topics_match_and_a_hand_made_one_is_reported_not_accepted(dev: Settings) -> None:
    admin = AdminClient({"bootstrap.servers": dev.kafka_bootstrap_servers})
    wrong = dev.topic(TOPICS.dlq.base)  # registry: 3 partitions, delete, 4 weeks
    admin.create_topics([NewTopic(wrong, 2, 1, config={
        "cleanup.policy": "compact", "retention.ms": "3600000"})])[wrong].result()

    with pytest.raises(TopicDriftError) as exc:
        create_topics(dev)
    problems = {d.problem.split(",")[0] for d in exc.value.drifts if d.topic == wrong}
    assert problems == {"2 partitions", "config cleanup.policy='compact'",
                        "config retention.ms='3600000'"}, exc.value.drifts
    assert {d.topic for d in exc.value.drifts} == {wrong}
    assert "DRIFT" in str(exc.value) and wrong in str(exc.value)
    # the missing ones were created all the same, as registered
    rest = [s for s in (*all_topics(), *internal_topics()) if s.base != TOPICS.dlq.base]
    assert verify_topics(dev, rest) == []
    assert sorted(map(str, verify_topics(dev))) == sorted(map(str, exc.value.drifts))

    env = {"KAFKA_BOOTSTRAP_SERVERS": dev.kafka_bootstrap_servers,
           "POSTBACKS_DATABASE_URL": dev.database_url, "POSTBACKS_KAFKA_REPLICATION": "dev",
           "POSTBACKS_TOPIC_PREFIX": dev.topic_prefix, "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "postbacks", "topics", "verify"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1
    assert f"DRIFT {wrong}: 2 partitions, registry says 3" in r.stderr
    r = subprocess.run([sys.executable, "-m", "postbacks", "topics", "create"], env=env,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0 and "3 difference(s)" in r.stderr, r.stderr


def test_a_topic_taking_smaller_batches_than_the_producers_make_is_drift(
        dev: Settings) -> None:
    """A topic whose max.message.bytes is under the producers' batch size: the broker
    refuses a full batch, and a stage's transaction holding it aborts at every retry (the
    partition stalls). ``topics verify`` names it."""
    spec = TOPICS.outcomes
    name = dev.topic(spec.base)
    admin = AdminClient({"bootstrap.servers": dev.kafka_bootstrap_servers})
    from topics.admin import wanted_configs

    admin.create_topics([NewTopic(name, spec.partitions, 1, config={
        **wanted_configs(dev, spec), "max.message.bytes": "500000"})])[name].result()
    drifts = [str(d) for d in verify_topics(dev, [spec])]
    assert len(drifts) == 1, drifts
    assert "config max.message.bytes='500000' is under the 1,000,000 bytes" in drifts[0]


def test_replication_drift_is_reported_against_the_settings(dev: Settings) -> None:
    create_topics(dev)
    assert verify_topics(dev) == []
    cluster = dataclasses.replace(dev, kafka_replication="cluster")
    drifts = verify_topics(cluster)
    names = {dev.topic(s.base) for s in (*all_topics(), *internal_topics())}
    rf = {d.topic for d in drifts if d.problem.startswith("replication factor 1, settings say 3")}
    isr = {d.topic for d in drifts
           if d.problem == "config min.insync.replicas='1', settings says '2'"}
    assert rf == names and isr == names
    with pytest.raises(TopicDriftError):
        create_topics(cluster)


def test_a_cluster_mode_creation_on_one_broker_says_what_to_set(dev: Settings) -> None:
    cluster = dataclasses.replace(dev, kafka_replication="cluster")
    with pytest.raises(ConfigError, match=r"has 1 broker\(s\) up; topics with 3 replicas.*"
                                          r"POSTBACKS_KAFKA_REPLICATION=dev"):
        create_topics(cluster)


def test_the_gate_does_not_start_on_a_changelog_that_differs(dev: Settings) -> None:
    create_topics(dev)
    admin = AdminClient({"bootstrap.servers": dev.kafka_bootstrap_servers})
    name = dev.topic(TOPICS.gate_global_changelog.base)
    admin.delete_topics([name], operation_timeout=30)[name].result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # deletion completes on the broker a moment later
        try:
            admin.create_topics([NewTopic(name, 2, 1)])[name].result()
            break
        except KafkaException:
            time.sleep(0.5)
    env = {"KAFKA_BOOTSTRAP_SERVERS": dev.kafka_bootstrap_servers,
           "POSTBACKS_DATABASE_URL": dev.database_url, "POSTBACKS_KAFKA_REPLICATION": "dev",
           "POSTBACKS_TOPIC_PREFIX": dev.topic_prefix, "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "postbacks", "gate"], env=env,
                       capture_output=True, text=True, timeout=90, check=False)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"DRIFT {name}: 2 partitions, registry says 1" in r.stderr
    assert f"DRIFT {name}: config cleanup.policy='delete', registry says 'compact'" in r.stderr
