"""An agent given a partition whose previous owner died mid-commit: a read-committed
consumer gets no committed offset while that owner's transaction (holding new offsets) is
open, and reading them timed out inside the assignment callback; the exception restarted
the agent in place, which rebalanced the group again, every 30 s until the coordinator
aborted the transaction. It now waits for it."""

from __future__ import annotations

import time

from confluent_kafka import Producer, TopicPartition

from postbacks.kafka.clients import make_consumer
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from streams.agent import GROUP, _load_skips
from topics import TOPICS
from topics.admin import create_topics


def test_committed_offsets_are_waited_for_past_an_open_transaction(settings: Settings) -> None:
    create_topics(settings, [TOPICS.dispatch])
    topic = settings.topic(TOPICS.dispatch.base)
    first = make_consumer(settings, GROUP)
    first.subscribe([topic])
    wait_for(lambda: bool(first.consume(1, 0.2) is not None and first.assignment()), 30,
             interval=0.0, what="the first member assigned")
    # the first owner's commit, never finished (the process was killed): its coordinator
    # aborts it after its transaction timeout
    zombie = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                       "transactional.id": settings.topic("test-zombie-agent"),
                       # past the 30 s the offsets' read was given (librdkafka's
                       # default is 60 s)
                       "transaction.timeout.ms": 40_000})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.send_offsets_to_transaction([TopicPartition(topic, 0, 5, metadata="x")],
                                       first.consumer_group_metadata(), 30)
    started = time.monotonic()
    second = make_consumer(settings, GROUP)
    try:
        skip: dict[tuple[str, int], set[int]] = {}
        _load_skips(second, [TopicPartition(topic, 0)], skip)
        waited = time.monotonic() - started
    finally:
        second.close()
        first.close()
    assert skip == {(topic, 0): set()}  # the aborted commit left no offset
    assert waited > 30, f"the offsets were readable after {waited:.1f} s: nothing was open"
