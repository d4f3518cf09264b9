"""The whole pipeline on the real broker and database, with a local receiver that verifies
every signature with the `standardwebhooks` library."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from postbacks.emit import ConversionProducer, synthetic_conversions
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from tests.e2e.harness import receiver_with_endpoints
from tests.kafka_util import scalar


@dataclass
class Pipeline:
    base: str
    expected: int


def start_pipeline(settings: Settings, stack: Stack, namespace: str, *, conversions: int,
                   apps: int, endpoints_per_app: int) -> Pipeline:
    base, _ = receiver_with_endpoints(stack, settings, namespace, apps=apps,
                                      endpoints_per_app=endpoints_per_app)
    for stage in ("sink", "relay", "agent", "gate", "fanout"):
        stack.start(stage, stage)
    producer = ConversionProducer(settings)
    for ev in synthetic_conversions(conversions, apps=apps, seed=7, namespace=namespace,
                                    now_ms=int(time.time() * 1000)):
        producer.send(ev)
    assert producer.flush() == 0 and producer.acked == conversions
    return Pipeline(base, conversions * endpoints_per_app)


def stats(p: Pipeline) -> dict[str, int]:
    result: dict[str, int] = http_json(f"{p.base}/_control/stats")
    return result


def assert_postgres_complete(settings: Settings, namespace: str, expected: int) -> None:
    like = f"ep_{namespace}_%"
    wait_for(lambda: scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id LIKE %s"
                            " AND status = 'delivered'", (like,)) == expected,
             180, what=f"{expected} delivered rows in PostgreSQL")
    assert scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id LIKE %s",
                  (like,)) == expected
    # The attempt and the outcome of one delivery are committed together by the agent but
    # reach PostgreSQL through different topics: the sink may hold the outcome a batch
    # before the attempt. Every delivered row gets its delivered attempt, within a bound.
    missing = ("SELECT count(*) FROM deliveries d WHERE endpoint_id LIKE %s AND NOT EXISTS"
               " (SELECT 1 FROM delivery_attempts a WHERE a.delivery_id = d.delivery_id"
               " AND a.result = 'delivered')")
    wait_for(lambda: scalar(settings, missing, (like,)) == 0, 60,
             what="a delivered attempt row for every delivered delivery")


def test_ten_thousand_conversions_delivered_signed_and_recorded(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    start = time.monotonic()
    p = start_pipeline(settings, stack, namespace, conversions=10_000, apps=20,
                       endpoints_per_app=1)
    wait_for(lambda: stats(p)["unique_ids"] >= p.expected, 300, interval=0.5,
             what="every delivery at the receiver")
    s = stats(p)
    assert s["unique_ids"] == p.expected
    assert s["bad_signatures"] == 0 and s["unverified"] == 0
    assert_postgres_complete(settings, namespace, p.expected)
    keys = {r["idempotency_key"] for r in http_json(f"{p.base}/_control/received")}
    like = f"ep_{namespace}_%"
    assert len(keys) == p.expected
    assert scalar(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id LIKE %s"
                  " AND idempotency_key = ANY(%s)", (like, list(keys))) == p.expected
    assert not stack.dead()
    for stage in ("sink", "relay", "agent", "gate", "fanout"):  # each settled its collector
        proc = stack.procs[stage]
        page = proc.metrics(timeout=5) or ""
        frozen = re.search(r"^postbacks_gc_frozen_objects (\S+)$", page, re.M)
        threshold = re.search(r"^postbacks_gc_gen0_threshold (\S+)$", page, re.M)
        assert frozen and float(frozen[1]) > 10_000, (proc.name, frozen)
        assert threshold and float(threshold[1]) == settings.gc_gen0_threshold, proc.name
    print(f"10k e2e: {p.expected} deliveries in {time.monotonic() - start:.1f}s "
          f"({s['received'] - s['unique_ids']} duplicates)")


def test_kill_9_of_the_agent_loses_nothing(
    settings: Settings, stack: Stack, namespace: str
) -> None:
    p = start_pipeline(settings, stack, namespace, conversions=4_000, apps=10,
                       endpoints_per_app=2)
    http_json(f"{p.base}/_control/script", {"*": {"statuses": [200], "delay_ms": 3}})
    wait_for(lambda: stats(p)["received"] >= 1000, 120, interval=0.05, what="1000 received")
    stack.procs["agent"].kill9()
    at_kill = stats(p)["received"]
    assert at_kill < p.expected, "the agent finished before it could be killed"
    stack.start("agent-restarted", "agent")
    wait_for(lambda: stats(p)["unique_ids"] >= p.expected, 240, interval=0.5,
             what="every delivery after the restart")
    s = stats(p)
    assert s["unique_ids"] == p.expected  # a re-send carries the same webhook-id
    assert s["bad_signatures"] == 0
    assert_postgres_complete(settings, namespace, p.expected)
    print(f"kill -9 at {at_kill} received; duplicates after restart: "
          f"{s['received'] - s['unique_ids']}")
