"""The gate's start: its Faust settings, and what must be in place before Faust starts.

A clean start is part of the contract: on a fresh cluster the gate starts and runs without
an ERROR line in its log, so an ERROR line always means something an operator must read.
Two things used to put one there, both before the first delivery:

- **Changelog topics created by Faust.** Faust creates its tables' changelogs as it starts,
  with its own replication factor and no ``min.insync.replicas``; its consumer's first
  group-coordinator lookup, sent while the broker is still taking in the new topics,
  failed (``GroupCoordinatorNotAvailableError``, logged at ERROR by aiokafka, retried).
  The changelogs are registry topics (``topics.internal_topics``): :func:`prepare` creates
  them with the configured replication, or finds them as registered, before Faust starts,
  and a changelog that differs stops the start with every difference named.
- **A group coordinator not yet there.** On a fresh cluster the first lookup of any group
  creates ``__consumer_offsets`` and fails until its partitions are led. :func:`prepare`
  waits for the gate group's coordinator through the admin client, which retries quietly.

And one while it runs: **overlapping commit timers.** Faust commits on a fixed schedule
(``broker_commit_interval``) and warns ``Timer commit is overlapping`` whenever a commit
takes longer than the interval, which a commit under a backlog does (it waits for every
record produced since the last one to be acknowledged: measured up to 0.44 s of a 0.5 s
interval at start behind 3,000 waiting deliveries). The gate commits from its own loop
instead, ``gate_commit_interval_s`` after the previous commit *ended*, so commits never
overlap; Faust's timer is set to a minute and only backs it up (a commit already running
is joined, not repeated). Faust runs its slow-processing check every 2.5 timer intervals,
now every 150 s instead of 1.25 s; the gate's own progress watch (``stall.py``) is the
check that restarts it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from postbacks.errors import ServiceUnavailable
from postbacks.settings import Settings
from topics import GATE_APP, TOPICS, internal_topics
from topics.admin import create_topics

__all__ = ["faust_settings", "prepare", "wait_group_coordinator"]

_FAUST_COMMIT_TIMER_S = 60.0


def faust_settings(settings: Settings) -> dict[str, Any]:
    """Faust settings that start fast and quietly, with the configured replication for any
    topic Faust creates itself (the changelogs exist by then: :func:`prepare`)."""
    return dict(
        broker=f"kafka://{settings.kafka_bootstrap_servers}",
        store="memory://",
        web_enabled=False,
        topic_replication_factor=settings.replication_factor,
        topic_partitions=TOPICS.deliveries.partitions,
        topic_disable_leader=True,
        table_standby_replicas=0,
        producer_acks=-1,  # acks=all, as every producer of the product (Settings.kafka_acks)
        broker_session_timeout=max(6.0, settings.consumer_session_timeout_ms / 1000),
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=10.0,
        broker_request_timeout=30.0,
        broker_commit_every=1 << 40,  # by interval only: a count-based commit runs inside
                                      # Faust's fetch loop and stalls every partition
        # Offsets are committed by the gate's own loop (GateProcess._commit_loop), every
        # gate_commit_interval_s after the previous commit ended; Faust's timer only backs
        # it up (see the module docstring).
        broker_commit_interval=_FAUST_COMMIT_TIMER_S,
        consumer_auto_offset_reset="earliest",
        producer_linger=0.002,
        broker_client_id="postbacks-gate-faust",
        stream_recovery_delay=0.0,
        processing_guarantee="at_least_once",
        datadir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "postbacks-gate",
                             f"{settings.topic_prefix}{settings.instance_id}"),
    )


def wait_group_coordinator(settings: Settings, group: str, timeout: float = 60.0) -> None:
    """Return once the broker names a coordinator for ``group`` (a describe of the group
    succeeds), or raise :class:`ServiceUnavailable` after ``timeout`` seconds."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "client.id": "postbacks-admin"})
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin.describe_consumer_groups([group], request_timeout=10)[group].result()
            return
        except KafkaException as exc:
            last = exc
            time.sleep(0.2)
    raise ServiceUnavailable(f"gate: no group coordinator for {group} after {timeout:g} s "
                             f"(last error: {last})")


def prepare(settings: Settings) -> None:
    """The tables' changelogs as registered (created if missing), and the gate group's
    coordinator known: then Faust's start finds everything it looks for."""
    create_topics(settings, internal_topics())
    wait_group_coordinator(settings, settings.topic(GATE_APP))
