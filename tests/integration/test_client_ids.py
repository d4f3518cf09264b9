"""Every stage's Kafka consumer names itself to the broker: its ``client.id`` is its
group's unprefixed name (``make_consumer``), which the broker shows in the group's
description, its request log and its per-client quotas and metrics."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from postbacks.kafka.clients import make_consumer
from postbacks.settings import Settings
from tests.kafka_util import joined
from topics import TOPICS


def test_a_consumers_client_id_is_its_group(settings: Settings) -> None:
    group = "postbacks-client-ids"
    consumer = make_consumer(settings, group)
    try:
        joined(consumer, settings.topic(TOPICS.dispatch.base))
        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
        described = admin.describe_consumer_groups([settings.topic(group)])
        members = described[settings.topic(group)].result(timeout=30).members
        assert [m.client_id for m in members] == [group]
    finally:
        consumer.close()
