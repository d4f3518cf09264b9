"""`postbacks topics create` against the real broker: it returns only once producers and
stages can use what it created."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from postbacks.settings import Settings, load_settings
from topics.admin import create_topics, delete_prefixed_topics
from topics.registry import all_topics


def test_created_topics_are_led_in_the_brokers_metadata_when_create_returns(
    migrated: dict[str, str], namespace: str,
) -> None:
    s: Settings = load_settings(migrated, topic_prefix=f"{namespace}.adm.")
    try:
        created = create_topics(s)
        # A fresh client, so nothing is read from the creating client's cache.
        md = AdminClient({"bootstrap.servers": s.kafka_bootstrap_servers}).list_topics(timeout=10)
        for spec in all_topics():
            name = s.topic(spec.base)
            assert name in created
            t = md.topics[name]
            assert t.error is None and len(t.partitions) == spec.partitions, name
            assert all(p.leader >= 0 for p in t.partitions.values()), name
        assert create_topics(s) == []  # idempotent: nothing left to create
    finally:
        delete_prefixed_topics(s, s.topic_prefix)
