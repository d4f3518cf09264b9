"""Waiting for a topic's open transactions to end before reading it to its end.

A read-committed consumer stops at a partition's last stable offset: the first record of
a transaction still open. Everything after it waits, records other producers committed
since included, until that transaction ends. One left open by a process killed mid-commit
ends only when its coordinator aborts it (``transaction.timeout.ms``: 60 s by default),
so a read "to the end" right after such a kill misses every later commit to the
partition, and returns what was true before them.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from postbacks.settings import Settings

__all__ = ["wait_stable"]

log = logging.getLogger(__name__)


def _ends(admin: AdminClient, tps: list[TopicPartition], level: IsolationLevel
          ) -> dict[int, int]:
    futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                 isolation_level=level, request_timeout=10)
    return {tp.partition: int(f.result().offset)  # type: ignore[attr-defined]  # (the stub)
            for tp, f in futures.items()}


def wait_stable(settings: Settings, topic: str, partitions: list[int], *,
                timeout_s: float = 90.0, poll_s: float = 0.5) -> float:
    """Wait until the last stable offset of each of ``topic``'s ``partitions`` reaches
    the end it had when called: every transaction open then has ended. Returns the
    seconds waited; past ``timeout_s`` (or if the broker cannot say) it logs and returns,
    and the caller reads what is stable."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "client.id": "postbacks-stable"})
    tps = [TopicPartition(topic, p) for p in partitions]
    started = time.monotonic()
    try:
        high = _ends(admin, tps, IsolationLevel.READ_UNCOMMITTED)
        while True:
            stable = _ends(admin, tps, IsolationLevel.READ_COMMITTED)
            behind = sorted(p for p, end in high.items() if stable.get(p, end) < end)
            waited = time.monotonic() - started
            if not behind:
                return waited
            if waited > timeout_s:
                log.warning("%s partition(s) %s: a transaction open for %.0f s has not "
                            "ended; reading what is stable", topic, behind, waited)
                return waited
            time.sleep(poll_s)
    except KafkaException as exc:
        log.warning("%s: cannot tell whether a transaction is open (%s); reading what is "
                    "stable", topic, exc)
        return time.monotonic() - started
