"""The agent's diverts against the relay and the broker: a delivery diverted until an hour
from now (a ``Retry-After: 3600``, or a slow endpoint's backlog paced an hour ahead) must
not hold the diverts of other endpoints that share its partition. In ``quarantine.v1``,
which releases a partition's records in order at their ``due_at``, it held them for the
hour; it now waits in the retry tier that fits, and a divert due in seconds comes back in
seconds."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Producer

from postbacks.codec import codec_for
from postbacks.core.retry import RetryPolicy
from postbacks.kafka.clients import make_consumer
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from streams.delivery import Deliverer
from tests.integration.relay_util import relay_running
from tests.unit.factories import make_delivery
from topics import TOPICS


def test_a_divert_due_in_an_hour_does_not_hold_another_endpoints_divert(
        settings: Settings, namespace: str) -> None:
    codec = codec_for("Delivery")
    now = int(time.time() * 1000)
    deliverer = Deliverer(None, RetryPolicy(5, 3600, 86_400, 0.2, 50, {}),  # type: ignore[arg-type]
                          clock=lambda: now / 1000)
    out: list[Any] = []
    later = make_delivery(delivery_id=f"dlv_{namespace}_later", endpoint_id="ep_busy")
    soon = make_delivery(delivery_id=f"dlv_{namespace}_soon", endpoint_id="ep_calm")
    deliverer.quarantine(out, later, "retry_after", now + 3_600_000, now)
    deliverer.quarantine(out, soon, "over_budget", now + 2_000, now)
    diverts = [(t, v) for t, _k, v in out if t != TOPICS.outcomes.base]
    assert [t for t, _ in diverts] == [TOPICS.retry_tier("1h").base, TOPICS.quarantine.base]

    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                  "enable.idempotence": True})
    for topic, value in diverts:  # one partition, as two endpoints sharing one would
        p.produce(settings.topic(topic), value, b"ep_shared", partition=0)
    assert p.flush(10) == 0

    reader = make_consumer(settings, f"test-divert-wait-{namespace}")
    reader.subscribe([settings.topic(TOPICS.dispatch.base)])
    back: dict[str, float] = {}

    def read() -> dict[str, float]:
        for m in reader.consume(100, 0.2):
            if m.error() is None and m.value():
                back.setdefault(str(codec.decode(m.value())["delivery_id"]), time.time())
        return back

    try:
        with relay_running(settings):
            wait_for(lambda: soon["delivery_id"] in read(), 30, interval=0.0,
                     what="the divert due in 2 s back on dispatch", progress=lambda: back)
            watched_until = time.monotonic() + 2  # and the hour-long one stays away
            while time.monotonic() < watched_until:
                assert later["delivery_id"] not in read(), back
    finally:
        reader.close()
    assert later["delivery_id"] not in back  # still waiting for its hour
    assert back[soon["delivery_id"]] - now / 1000 < 15
