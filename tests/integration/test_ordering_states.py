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


def test_states_committed_behind_an_open_transaction_are_waited_for(
        settings: Settings) -> None:
    """An agent killed mid-commit leaves its transaction on ordering.v1 open. A read to the
    end stopped at its first record (the last stable offset), so a state another agent
    committed after it was not seen: a survivor given its own partitions back after the
    rebalance adopted the state from before its last commit (a head already delivered, a
    follower not yet parked)."""
    import time

    from topics.admin import create_topics as create

    create(settings, [TOPICS.ordering])
    topic = settings.topic(TOPICS.ordering.base)
    old = OrderState("dlv_old", "retry.5s.v1", 1_700_000_000_000, None, None, 0, 1)
    new = OrderState(None, None, 0, None, None, 0, 0)  # its head since delivered
    plain = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    plain.produce(topic, old.dump(), b"ep_survivor", partition=0)
    assert plain.flush(30) == 0
    zombie = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                       "transactional.id": settings.topic("test-ordering-zombie"),
                       "transaction.timeout.ms": 10_000})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, OrderState("dlv_z", "retry.5s.v1", 1, None, None, 0, 0).dump(),
                   b"ep_zombie", partition=0)
    assert zombie.flush(30) == 0  # written, never committed: the process was killed
    survivor = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "transactional.id": settings.topic("test-ordering-survivor")})
    survivor.init_transactions(30)
    survivor.begin_transaction()
    survivor.produce(topic, new.dump(), b"ep_survivor", partition=0)
    survivor.commit_transaction(30)

    started = time.monotonic()
    states = load_states(settings, timeout_s=60)
    waited = time.monotonic() - started

    assert states["ep_survivor"] == new, states.get("ep_survivor")
    assert "ep_zombie" not in states  # aborted by its coordinator
    assert waited > 3, f"read after {waited:.1f} s: the zombie's transaction was not open"
