"""The relay against the broker: a delivery on a delay topic whose ``due_at`` is further
ahead than any configuration schedules (a wrong clock, another producer) used to pause its
partition until then, so every retry behind it waited years. It is dead-lettered, naming
``due_at``, and the deliveries behind it go on."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from prometheus_client import REGISTRY

from postbacks.codec import codec_for
from postbacks.kafka.clients import make_consumer
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from tests.integration.relay_util import relay_running
from tests.unit.factories import make_delivery
from topics import TOPICS


def test_a_due_at_years_ahead_is_dead_lettered_and_the_partition_flows(
        settings: Settings) -> None:
    codec, dlq = codec_for("Delivery"), codec_for("DeadLetter")
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    topic = settings.topic(TOPICS.retry_tier("5s").base)
    for did, due in (("dlv_far", now + 10 * 365 * 86_400_000), ("dlv_next", now),
                     ("dlv_soon", now + 2_000)):
        p.produce(topic, codec.encode(make_delivery(delivery_id=did, endpoint_id="ep_f",
                                                    due_at=due)), b"ep_f", partition=0)
    assert p.flush(10) == 0

    reader = make_consumer(settings, "test-far-reader")
    reader.subscribe([settings.topic(TOPICS.dispatch.base), settings.topic(TOPICS.dlq.base),
                      settings.topic(TOPICS.outcomes.base)])
    got: dict[str, str] = {}

    def read() -> dict[str, str]:
        for m in reader.consume(100, 0.2):
            if m.error() is not None or not m.value():
                continue
            if m.topic().endswith(TOPICS.outcomes.base):
                o = codec_for("Outcome").decode(m.value())
                got[f"outcome {o['delivery_id']}"] = f"{o['kind']}: {o['reason']}"
            elif m.topic().endswith(TOPICS.dlq.base):
                dl = dlq.decode(m.value())
                got[str(codec.decode(dl["original_value"])["delivery_id"])] = (
                    f"{dl['reason']}: {dl['error_message']}")
            else:
                got[str(codec.decode(m.value())["delivery_id"])] = "dispatched"
        return got

    try:
        with relay_running(settings):
            wait_for(lambda: len(read()) == 4, 60, interval=0.0,
                     what="every delivery dispatched or dead-lettered", progress=lambda: got)
    finally:
        reader.close()
    assert got["dlv_next"] == got["dlv_soon"] == "dispatched"
    assert got["dlv_far"].startswith("invalid_record: delivery 'dlv_far': due_at "), got
    assert "h ahead of the relay's clock" in got["dlv_far"]
    # and it ends on outcomes.v1 (its status stayed quarantined or failing for good)
    assert got["outcome dlv_far"] == "dead_lettered: invalid_record"


def test_the_relays_throughput_counts_records_not_partitions(settings: Settings) -> None:
    """``postbacks_stage_records_total{stage="relay"}`` grew by the partitions of each
    batch (and for aborted batches too): 20 records due at once counted one or two."""
    codec = codec_for("Delivery")
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    topic = settings.topic(TOPICS.retry_tier("5s").base)
    for i in range(20):
        p.produce(topic, codec.encode(make_delivery(delivery_id=f"dlv_count_{i}",
                                                    endpoint_id="ep_count", due_at=now)),
                  b"ep_count", partition=0)
    assert p.flush(10) == 0

    def released() -> float:
        return REGISTRY.get_sample_value("postbacks_stage_records_total",
                                         {"stage": "relay"}) or 0.0

    before = released()
    with relay_running(settings):
        wait_for(lambda: released() >= before + 20, 60, progress=released,
                 what="20 records counted")
    assert released() == before + 20  # the relay stopped: nothing more was counted


def test_a_quarantine_or_tier_head_with_a_far_due_at_ripens_within_its_period(
        settings: Settings) -> None:
    """A head due 72 h ahead (within the bound above) that no agent put there: on
    ``quarantine.v1`` (the agent puts a record there at most a minute before its due
    time), or on a tier with an ``enqueued_at`` ahead of the relay's clock. Each used to
    ripen only at its ``due_at``, pausing its partition, and every other endpoint's
    delivery behind it, for 72 h. It ripens within its topic's period and moves on to the
    delay topic its wait belongs in; the deliveries behind it go to dispatch."""
    codec = codec_for("Delivery")
    now = int(time.time() * 1000)
    far = now + 72 * 3_600_000
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    quarantine = settings.topic(TOPICS.quarantine.base)
    tier = settings.topic(TOPICS.retry_tier("5s").base)
    heads = [(quarantine, "dlv_q_far", far, now - 118_000), (quarantine, "dlv_q_next", now, now),
             (tier, "dlv_t_far", far, far), (tier, "dlv_t_next", now, now)]
    for topic, did, due, enqueued in heads:
        p.produce(topic, codec.encode(make_delivery(
            delivery_id=did, endpoint_id="ep_h", due_at=due, enqueued_at=enqueued)),
            b"ep_h", partition=0)
    assert p.flush(10) == 0

    delay_topics = {settings.topic(s.base) for s in (*TOPICS.retry, TOPICS.quarantine)}
    reader = make_consumer(settings, "test-far-head-reader")
    reader.subscribe([settings.topic(TOPICS.dispatch.base), *sorted(delay_topics)])
    got: dict[str, str] = {}

    def read() -> dict[str, str]:
        for m in reader.consume(100, 0.2):
            if m.error() is not None or not m.value():
                continue
            d = codec.decode(m.value())
            did = str(d["delivery_id"])
            if m.topic() not in delay_topics:
                got[did] = "dispatched"
            elif did.endswith("_far") and now - 60_000 < (d["enqueued_at"] or 0) < far - 60_000:
                got[did] = m.topic()  # republished by the relay, enqueued on its clock
        return got

    started = time.monotonic()
    try:
        with relay_running(settings):
            wait_for(lambda: {"dlv_q_next", "dlv_t_next"} <= set(read()) and
                     {"dlv_q_far", "dlv_t_far"} <= set(got), 60, interval=0.0,
                     what="the records behind the far heads dispatched, the heads moved on",
                     progress=lambda: got)
    finally:
        reader.close()
    assert time.monotonic() - started < 60
    assert got["dlv_q_next"] == got["dlv_t_next"] == "dispatched"
    # each goes on to the retry tier its 72-h wait belongs in
    assert got["dlv_q_far"] == got["dlv_t_far"] == settings.topic(
        TOPICS.retry_tier("6h").base), got
