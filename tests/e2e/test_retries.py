"""Transient failures go through the delay topics and the relay, never early."""

from __future__ import annotations

import itertools
import time

from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from tests.e2e.test_pipeline import start_pipeline, stats
from tests.kafka_util import scalar


def test_failing_first_two_requests_then_delivered_on_schedule(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    p = start_pipeline(settings, stack, namespace, conversions=0, apps=1, endpoints_per_app=1)
    http_json(f"{p.base}/_control/script", {"*": {"statuses": [500, 503, 200]}})
    producer = ConversionProducer(settings)
    for ev in synthetic_conversions(1, apps=1, seed=3, namespace=namespace,
                                    now_ms=int(time.time() * 1000)):
        producer.send(ev)
    assert producer.flush() == 0
    wait_for(lambda: stats(p)["received"] >= 3, 90, interval=0.2, what="three attempts")
    got = http_json(f"{p.base}/_control/received")
    assert [r["status"] for r in got] == [500, 503, 200]
    assert [r["attempt"] for r in got] == ["1", "2", "3"]
    assert len({r["webhook_id"] for r in got}) == 1  # the same idempotency key every time
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(got)]
    # schedule: 5 s then 10 s (+ up to 20 % jitter), never earlier
    assert gaps[0] >= 5.0 and gaps[1] >= 10.0, gaps
    assert gaps[0] < 5.0 * 1.2 + 5 and gaps[1] < 10.0 * 1.2 + 5, gaps
    like = f"ep_{namespace}_%"
    wait_for(lambda: scalar(settings, "SELECT status FROM deliveries WHERE endpoint_id LIKE %s",
                            (like,)) == "delivered", 60, what="delivered status")
    assert scalar(settings, "SELECT count(*) FROM delivery_attempts WHERE endpoint_id LIKE %s",
                  (like,)) == 3
    assert scalar(settings, "SELECT attempt_count FROM deliveries WHERE endpoint_id LIKE %s",
                  (like,)) == 3
    print(f"retry gaps: {gaps[0]:.2f}s (due 5-6s), {gaps[1]:.2f}s (due 10-12s)")
