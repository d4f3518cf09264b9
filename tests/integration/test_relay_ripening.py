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
    # the long wait went back to the end of retry.1h, not out
    hops = [(t, enq) for t, enq in seen["dlv_long"] if enq > now + HOUR_MS]
    assert hops and all(t == tier for t, _ in hops), seen
    assert not any(t.endswith(TOPICS.dispatch.base) for t, _ in seen["dlv_long"]), seen


def test_hops_keep_one_endpoints_records_in_order(settings: Settings) -> None:
    """A strict endpoint's head and the followers parked behind it share one due time and
    one partition; hopping through the tiers must not let a follower overtake."""
    codec = codec_for("Delivery")
    now = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    tier = settings.topic(TOPICS.retry_tier("1h").base)
    order = [("dlv_head", 0), ("dlv_f1", 100_000), ("dlv_f2", 2_000_000)]
    for did, later in order:
        p.produce(tier, codec.encode(make_delivery(delivery_id=did, endpoint_id="ep_s",
                                                   enqueued_at=now + later,
                                                   due_at=now + 2 * HOUR_MS)),
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
    assert sent == [did for did, _ in order]
