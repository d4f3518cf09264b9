"""Feeding the gate deliveries directly and watching what it writes."""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from postbacks.codec import codec_for
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from tests.unit.factories import make_conversion, make_delivery
from topics import GATE_APP, TOPICS

HOUR_MS = 3_600_000
PARTIAL_WINDOW_MS = 60_000  # the gate's partials are per event-time minute
_DELIVERY = codec_for("Delivery")


def metric(port: int, name: str, **labels: str) -> float:
    """A sample from a process's /metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and ",".join(sorted((m.group(2) or "").split(","))) == want:
            return float(m.group(3))
    return 0.0


def endpoint_on(partition: int, prefix: str) -> str:
    """An endpoint id ``<prefix>_<n>`` whose key goes to ``partition`` of deliveries.v1 (the
    gate dead-letters a delivery off its endpoint's partition)."""
    from streams.anomaly_gate.placement import home_partition

    n = 0
    while home_partition(f"{prefix}_{n}".encode(), TOPICS.deliveries.partitions) != partition:
        n += 1
    return f"{prefix}_{n}"


class GateFeed:
    """Deliveries straight onto deliveries.v1 (keyed by endpoint); outputs read back."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                                  "partitioner": "murmur2_random", "linger.ms": 5,
                                  # in order: a retried batch (a topic just created)
                                  # must not land after the ones sent behind it
                                  "enable.idempotence": True})
        self.consumer = Consumer({
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": f"test-feed-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        })
        self.consumer.subscribe([settings.topic(TOPICS.dispatch.base),
                                 settings.topic(TOPICS.held.base)])
        self.dispatched: dict[str, dict[str, Any]] = {}
        self._held: dict[str, dict[str, Any]] = {}
        self._held_order: list[str] = []
        self.n = 0

    @staticmethod
    def hour_ago(weeks: int) -> int:
        """Start of the hour ``weeks`` weeks before the current hour."""
        now = int(time.time() * 1000)
        return now - now % HOUR_MS - weeks * 168 * HOUR_MS

    def send(self, endpoint_id: str, occurred_at: int, payout: int | None,
             partition: int | None = None, **conv: Any) -> str:
        """One delivery; ``partition``: onto that partition (else by the endpoint's key)."""
        self.n += 1
        conv.setdefault("source_created_at", occurred_at)
        conv.setdefault("source_completed_at", occurred_at - 60_000)
        c = make_conversion(event_id=f"evt_{self.n}",
                            conversion_id=f"cv_{uuid.uuid4().hex[:12]}",
                            app_id=f"app_{endpoint_id}", occurred_at=occurred_at,
                            payout_usd_micros=payout, **conv)
        did = f"dlv_{self.n}_{uuid.uuid4().hex[:6]}"
        d = make_delivery(delivery_id=did, endpoint_id=endpoint_id, conversion=c,
                          created_at=occurred_at, enqueued_at=None)
        while True:
            try:
                if partition is None:
                    self.producer.produce(self.s.topic(TOPICS.deliveries.base),
                                          _DELIVERY.encode(d), endpoint_id.encode())
                else:
                    self.producer.produce(self.s.topic(TOPICS.deliveries.base),
                                          _DELIVERY.encode(d), endpoint_id.encode(),
                                          partition=partition)
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)
        return did

    def flush(self) -> None:
        assert self.producer.flush(30) == 0

    def poll(self) -> None:
        self.flush()
        while True:
            msgs = self.consumer.consume(2000, timeout=0.2)
            if not msgs:
                return
            for m in msgs:
                if m.error() is not None:
                    continue
                d = _DELIVERY.decode(m.value())
                if m.topic().endswith(TOPICS.held.base):
                    if d["delivery_id"] not in self._held:
                        self._held_order.append(d["delivery_id"])
                    self._held[d["delivery_id"]] = d
                else:
                    self.dispatched[d["delivery_id"]] = d

    def held(self) -> list[dict[str, Any]]:
        self.poll()
        return [self._held[k] for k in self._held_order]

    def dispatched_count(self) -> int:
        self.poll()
        return len(self.dispatched)

    def outputs(self) -> int:
        self.poll()
        return len(self.dispatched) + len(self._held)

    def wait_outputs(self, n: int, timeout: float = 60) -> None:
        wait_for(lambda: self.outputs() >= n, timeout, what=f"{n} distinct gate outputs",
                 progress=self.outputs)

    def wait_held(self, n: int, timeout: float = 60) -> None:
        wait_for(lambda: len(self.held()) >= n, timeout, what=f"{n} held")

    def partial_sum(self, occurred_at: int) -> int:
        """Sum over partitions of the latest (highest source offset) partial of the minute
        holding ``occurred_at``."""
        codec = codec_for("PayoutPartial")
        c = Consumer({"bootstrap.servers": self.s.kafka_bootstrap_servers,
                      "group.id": f"test-partials-{uuid.uuid4().hex[:8]}",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe([self.s.topic(TOPICS.anomaly_partials.base)])
        window = occurred_at - occurred_at % PARTIAL_WINDOW_MS
        latest: dict[int, tuple[int, int]] = {}
        idle = 0
        try:
            while idle < 4:
                msgs = c.consume(2000, timeout=0.5)
                idle = 0 if msgs else idle + 1
                for m in msgs:
                    if m.error() is None:
                        p = codec.decode(m.value())
                        if p["window_start"] == window:
                            cur = latest.get(p["partition"])
                            if cur is None or p["source_offset"] > cur[0]:
                                latest[p["partition"]] = (p["source_offset"],
                                                          p["total_micros"])
        finally:
            c.close()
        return sum(t for _, t in latest.values())

    def wait_partials_applied(self, timeout: float = 60) -> None:
        """Until the gates' group has committed every partial on anomaly.partials.v1 (its
        one partition) and no new one has arrived for a second: the aggregator has applied
        all the partials of the outputs seen so far."""
        tp = TopicPartition(self.s.topic(TOPICS.anomaly_partials.base), 0)
        c = Consumer({"bootstrap.servers": self.s.kafka_bootstrap_servers,
                      "group.id": self.s.topic(GATE_APP), "enable.auto.commit": False})
        last: list[int] = []

        def settled() -> bool:
            high = c.get_watermark_offsets(tp, timeout=5)[1]
            done = c.committed([tp], timeout=5)[0].offset
            last.append(high if done >= high > 0 else -1)
            return len(last) >= 2 and last[-1] >= 0 and last[-1] == last[-2]

        try:
            wait_for(settled, timeout, interval=1.0,
                     what="the aggregator to commit every partial")
        finally:
            c.close()
