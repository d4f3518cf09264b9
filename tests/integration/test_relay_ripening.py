"""The relay against the broker: a retry tier holds waits from its own period to the next
tier's, and endpoints share partitions, so a record due in 5 h at a partition's head used
to hold one due in 1.5 h behind it for 3.5 h (every endpoint on the partition late by
hours; a strict endpoint's order broken). A retry-tier record now ripens one tier period
after it was enqueued: the one behind goes out when due, the one ahead goes back to the end
of its tier (it hops), which keeps one endpoint's records in their order."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.kafka.clients import make_consumer
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from tests.integration.relay_util import relay_running
from tests.unit.factories import make_delivery
from topics import TOPICS

HOUR_MS = 3_600_000


def test_a_later_due_head_holds_no_record_behind_it(settings: Settings) -> None:
    codec = codec_for("Delivery")
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    tier = settings.topic(TOPICS.retry_tier("1h").base)
    for did, enqueued, due in (("dlv_long", now, now + 5 * HOUR_MS),
                               ("dlv_short", now + 60_000, now + 90 * 60_000)):
        p.produce(tier, codec.encode(make_delivery(delivery_id=did, endpoint_id=did,
                                                   enqueued_at=enqueued, due_at=due)),
                  did.encode(), partition=0)
    assert p.flush(10) == 0

    reader = make_consumer(settings, "test-ripening-reader")
    reader.subscribe([settings.topic(TOPICS.dispatch.base), tier])
    seen: dict[str, list[tuple[str, int]]] = {}

    def read() -> dict[str, list[tuple[str, int]]]:
        for m in reader.consume(100, 0.2):
            if m.error() is None and m.value():
                d = codec.decode(m.value())
                seen.setdefault(str(d["delivery_id"]), []).append(
                    (m.topic(), int(d["enqueued_at"] or 0)))
        return seen

    # the relay's clock 1.5 h ahead (+5 s): the short wait is due, the long one is not
    ahead_s = 90 * 60 + 5
    try:
        with relay_running(settings, clock=lambda: time.time() + ahead_s):
            wait_for(lambda: any(t.endswith(TOPICS.dispatch.base)
                                 for t, _ in read().get("dlv_short", [])), 60, interval=0.0,
                     what="the record behind the later-due head dispatched",
                     progress=lambda: seen)
            wait_for(lambda: len(read().get("dlv_long", [])) >= 2, 30, interval=0.0,
                     what="the later-due head hopped on", progress=lambda: seen)
    finally:
        reader.close()
    # the long wait (4 h left) went back to the end of retry.1h, not out
    hops = [(t, enq) for t, enq in seen["dlv_long"] if enq >= now + HOUR_MS]
    assert hops and all(t == tier for t, _ in hops), seen
    assert not any(t.endswith(TOPICS.dispatch.base) for t, _ in seen["dlv_long"]), seen


def test_hops_keep_one_endpoints_records_in_order(settings: Settings) -> None:
    """A strict endpoint's head and the followers parked behind it share one due time, one
    enqueue time (the head's: the agent parks them with it) and one partition; hopping
    through the tiers must not let a follower overtake. (With enqueue times of their own
    they ripen apart, so the relay cannot keep them in order: the agent parks a follower
    that comes back before its head again.)"""
    codec = codec_for("Delivery")
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    tier = settings.topic(TOPICS.retry_tier("1h").base)
    order = ["dlv_head", "dlv_f1", "dlv_f2"]
    for did in order:
        p.produce(tier, codec.encode(make_delivery(delivery_id=did, endpoint_id="ep_s",
                                                   enqueued_at=now,
                                                   due_at=now + 150 * 60_000)),
                  b"ep_s", partition=0)
    assert p.flush(10) == 0
    reader = make_consumer(settings, "test-ripening-order")
    reader.subscribe([settings.topic(TOPICS.dispatch.base)])
    sent: list[str] = []

    def read() -> list[str]:
        for m in reader.consume(100, 0.2):
            if m.error() is None and m.value():
                sent.append(str(codec.decode(m.value())["delivery_id"]))
        return sent

    start = time.time()  # the relay's clock runs an hour a second: each record hops once
    try:
        with relay_running(settings, clock=lambda: start + (time.time() - start) * 3600):
            wait_for(lambda: len(read()) >= 3, 60, interval=0.0, what="the three dispatched",
                     progress=lambda: sent)
    finally:
        reader.close()
    assert sent == order


def test_a_record_ripe_before_its_due_time_is_not_held_behind_later_ones(
        settings: Settings) -> None:
    """A (due 40 s after it entered retry.30s.v1) ripens at 30 s with 10 s left. It went
    back to the end of its own tier, behind B (its endpoint's next retry, enqueued at 26 s,
    ripe at 56 s), and left
    16 s late: a 6.5-h retry left retry.6h.v1 after 12 h that way. It now hops to the
    topic of its remaining wait (quarantine.v1) and leaves when due."""
    codec = codec_for("Delivery")
    real0 = time.time()
    t0 = int(real0 * 1000)
    speed = 10  # the relay's clock: 10 s a second

    def fake() -> float:
        return real0 + (time.time() - real0) * speed

    # keyed as the relay keys its hops (murmur2): A's hop lands in the partition B is in
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True, "partitioner": "murmur2_random"})
    tier = settings.topic(TOPICS.retry_tier("30s").base)
    p.produce(tier, codec.encode(make_delivery(delivery_id="dlv_a", endpoint_id="ep_a",
                                               enqueued_at=t0, due_at=t0 + 40_000)),
              b"ep_a")
    assert p.flush(10) == 0
    reader = make_consumer(settings, "test-ripening-late")
    reader.subscribe([settings.topic(TOPICS.dispatch.base)])
    lateness: dict[str, int] = {}

    def read() -> dict[str, int]:
        for m in reader.consume(100, 0.2):
            if m.error() is None and m.value():
                d = codec.decode(m.value())
                lateness[str(d["delivery_id"])] = int(d["enqueued_at"] or 0) - int(
                    d["due_at"] or 0)
        return lateness

    try:
        with relay_running(settings, clock=fake):
            wait_for(lambda: fake() >= real0 + 26, 30, interval=0.01, what="26 s on its clock")
            b_at = int(fake() * 1000)
            p.produce(tier, codec.encode(make_delivery(
                delivery_id="dlv_b", endpoint_id="ep_a", enqueued_at=b_at,
                due_at=b_at + 600_000)), b"ep_a")
            assert p.flush(10) == 0
            wait_for(lambda: "dlv_a" in read(), 30, interval=0.0, what="A dispatched",
                     progress=lambda: lateness)
    finally:
        reader.close()
    assert 0 <= lateness["dlv_a"] < 10_000, lateness  # (the relay polls every 5 s here)
