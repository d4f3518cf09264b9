"""A starting agent reads every strict endpoint's committed state from ``ordering.v1``. A
record it cannot read -- a key that is not UTF-8, a value that is not a state -- is
passed over with a warning: it used to raise out of the assignment, and the agent
restarted on it for as long as the record stayed in the compacted topic."""

from __future__ import annotations

from confluent_kafka import Producer

from postbacks.settings import Settings
from streams.strict import OrderState, load_states
from topics import TOPICS
from topics.admin import create_topics


def test_unreadable_ordering_records_are_passed_over(settings: Settings) -> None:
    create_topics(settings, [TOPICS.ordering])  # (the agent creates it at its start)
    topic = settings.topic(TOPICS.ordering.base)
    state = OrderState("dlv_1", "quarantine.v1", 1_700_000_000_000, "dlv_3", None, 0, 2)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    producer.produce(topic, state.dump(), b"\xff\xfe not utf-8", partition=0)
    producer.produce(topic, b"{not json", b"ep_bad_value", partition=0)
    producer.produce(topic, b"\xff\xfe", b"ep_bad_bytes", partition=0)
    # JSON, but not a state: 1e400 is a float infinity (int() of it raised OverflowError)
    producer.produce(topic, b'{"due_at": 1e400}', b"ep_inf", partition=0)
    producer.produce(topic, b'{"head": 5}', b"ep_bad_head", partition=0)
    producer.produce(topic, b"[" * 100_000 + b"]" * 100_000, b"ep_deep", partition=0)
    producer.produce(topic, state.dump(), b"ep_strict", partition=0)
    assert producer.flush(30) == 0

    states = load_states(settings, timeout_s=60)

    assert states["ep_strict"] == state
    assert not {"ep_bad_value", "ep_bad_bytes", "ep_inf", "ep_bad_head", "ep_deep"} & set(states)
