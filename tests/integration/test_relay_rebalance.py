"""The relay against the broker: a partition it paused (its head not yet due) and lost in a
rebalance is read again when it comes back. librdkafka keeps a partition's pause across a
revocation and a later assignment (confluent-kafka-go#193, librdkafka#1849), while the relay
drops what it held for a revoked partition: without a resume at the revocation, the
partition stayed paused with nothing held to resume it, and its deliveries waited forever.
Seen after a broker kill (the relay's session timed out): 1,089 quarantined deliveries
never came back. The rebalance here is a second member joining and leaving."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY

from postbacks.codec import codec_for
from postbacks.kafka.clients import make_consumer
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from streams.relay import GROUP, run_relay
from tests.unit.factories import make_delivery
from topics import TOPICS


def _dispatched(consumer: Consumer, seen: set[str]) -> set[str]:
    codec = codec_for("Delivery")
    for m in consumer.consume(100, 0.2):
        if m.error() is None and m.value():
            seen.add(str(codec.decode(m.value())["delivery_id"]))
    return seen


def _paused() -> float:
    return REGISTRY.get_sample_value("postbacks_relay_paused_partitions") or 0.0


def _owns_quarantine_0(settings: Settings) -> bool:
    group = settings.topic(GROUP)
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
    topic = settings.topic(TOPICS.quarantine.base)
    return any(tp.topic == topic and tp.partition == 0
               for m in desc.members for tp in m.assignment.topic_partitions)


def test_a_paused_partition_lost_in_a_rebalance_is_read_again(settings: Settings) -> None:
    codec = codec_for("Delivery")
    due_in_s = 15.0
    due_at = int((time.time() + due_in_s) * 1000)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    p.produce(settings.topic(TOPICS.quarantine.base),
              codec.encode(make_delivery(delivery_id="dlv_paused", endpoint_id="ep_r",
                                         due_at=due_at, enqueued_at=int(time.time() * 1000))),
              b"ep_r", partition=0)
    assert p.flush(10) == 0

    reader = make_consumer(settings, "test-dispatch-reader")
    reader.subscribe([settings.topic(TOPICS.dispatch.base)])
    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(settings, stop), daemon=True)
    relay.start()
    rival: Consumer | None = None
    try:
        # the relay reads the record, finds it not due and pauses partition 0; then a second
        # member joins (every partition is revoked: eager assignment) and leaves again, and
        # partition 0 comes back to the relay before the record is due
        wait_for(lambda: _owns_quarantine_0(settings), 30, interval=0.2,
                 what="the relay given quarantine.v1 partition 0")
        wait_for(lambda: _paused() == 1, 30, interval=0.05,
                 what="the relay holding partition 0 paused behind the record")
        rival = make_consumer(settings, GROUP)
        rival.subscribe([settings.topic(TOPICS.quarantine.base)])

        def joined(c: Consumer = rival) -> bool:
            c.consume(1, 0.2)  # serves the group's callbacks; commits nothing
            return bool(c.assignment())

        wait_for(joined, 20, interval=0.0, what="a second relay member given partitions")
        rival.close()
        rival = None
        assert time.time() * 1000 < due_at, "the rebalance took longer than the record's delay"

        seen: set[str] = set()
        wait_for(lambda: "dlv_paused" in _dispatched(reader, seen), 40, interval=0.0,
                 what="the paused delivery republished after the rebalance",
                 progress=lambda: f"republished {sorted(seen)}")
        assert time.time() * 1000 >= due_at  # and not before it was due
        wait_for(lambda: _paused() == 0, 10, interval=0.05, what="no partition left paused")
        # the republishing transaction was timed (postbacks_transaction_seconds)
        for step in ("offsets", "commit"):
            assert (REGISTRY.get_sample_value("postbacks_transaction_seconds_count",
                                              {"stage": "relay", "step": step}) or 0) >= 1
    finally:
        stop.set()
        relay.join(30)
        if rival is not None:
            rival.close()
        reader.close()
    assert not relay.is_alive()
