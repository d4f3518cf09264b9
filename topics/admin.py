"""Create and verify the registry's topics on a broker (idempotent), reporting drift.

A topic is what the registry says (partitions, cleanup policy, the retention it registers)
with the replication of the settings (``Settings.replication_factor`` replicas,
``min.insync.replicas`` ``Settings.min_insync_replicas``). :func:`create_topics` creates
what is missing and refuses to pass over an existing topic that differs
(:class:`TopicDriftError`, every difference named); :func:`verify_topics` lists the
differences (``postbacks topics verify`` prints them and exits 1).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from postbacks.errors import ConfigError, ServiceUnavailable
from postbacks.kafka.clients import check_broker
from postbacks.settings import Settings
from topics.registry import TopicSpec, all_topics, internal_topics

__all__ = ["Drift", "TopicDriftError", "create_topics", "under_replicated", "verify_topics",
           "wanted_configs"]


@dataclass(frozen=True, slots=True)
class Drift:
    topic: str
    problem: str

    def __str__(self) -> str:
        return f"{self.topic}: {self.problem}"


class TopicDriftError(ConfigError):
    """Existing topics differ from the registry and the replication settings."""

    def __init__(self, drifts: list[Drift]) -> None:
        self.drifts = drifts
        super().__init__(
            f"{len(drifts)} difference(s) between the broker and the registry (the topics "
            "are left as they are; fix them or the settings, then `postbacks topics "
            "verify`):\n" + "\n".join(f"  DRIFT {d}" for d in drifts))


def _admin(settings: Settings) -> AdminClient:
    check_broker(settings)  # a broker that is not there: one line naming it, not a log flood
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers,
                        "client.id": "postbacks-admin"})


def _metadata(admin: AdminClient, timeout: float = 15.0) -> Any:
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ServiceUnavailable(f"Kafka metadata request failed: {exc}") from exc


def _specs(specs: list[TopicSpec] | None) -> list[TopicSpec]:
    return specs if specs is not None else [*all_topics(), *internal_topics()]


def wanted_configs(settings: Settings, spec: TopicSpec) -> dict[str, str]:
    """The topic configs a spec is created with and verified against."""
    return {"cleanup.policy": "delete", **spec.configs,
            "min.insync.replicas": str(settings.min_insync_replicas)}


def create_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create the missing topics (default: every registry topic and the gate's changelogs);
    returns the names created. An existing topic that differs raises
    :class:`TopicDriftError` (after the missing ones are created): nothing is changed on it.
    """
    specs = _specs(specs)
    admin = _admin(settings)
    md = _metadata(admin)
    wanted = [s for s in specs if settings.topic(s.base) not in md.topics]
    existing = [s for s in specs if settings.topic(s.base) in md.topics]
    created: list[str] = []
    if wanted:
        rf = settings.replication_factor
        if len(md.brokers) < rf:
            raise ConfigError(
                f"the cluster at {settings.kafka_bootstrap_servers} has {len(md.brokers)} "
                f"broker(s) up; topics with {rf} replicas need at least {rf} "
                f"(POSTBACKS_KAFKA_REPLICATION={settings.kafka_replication}; a single "
                "development broker runs with POSTBACKS_KAFKA_REPLICATION=dev)")
        futures = admin.create_topics(
            [NewTopic(settings.topic(s.base), s.partitions, rf,
                      config=wanted_configs(settings, s)) for s in wanted],
            operation_timeout=30, request_timeout=30)
        for name, fut in futures.items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:
                if exc.args and getattr(exc.args[0], "name", lambda: "")() == \
                        "TOPIC_ALREADY_EXISTS":
                    existing += [s for s in wanted if settings.topic(s.base) == name]
                    continue
                raise ServiceUnavailable(f"cannot create topic {name}: {exc}") from exc
        led = {settings.topic(s.base): s.partitions for s in wanted
               if settings.topic(s.base) in created}
        for host_port in sorted({f"{b.host}:{b.port}" for b in md.brokers.values()}):
            # every broker's own metadata: a client may ask any of them next
            _wait_led(AdminClient({"bootstrap.servers": host_port, "client.id": "postbacks-admin"}),
                      led)
    if existing:
        drifts = verify_topics(settings, existing)
        if drifts:
            raise TopicDriftError(drifts)
    return created


def _wait_led(admin: AdminClient, wanted: dict[str, int], timeout: float = 30.0) -> None:
    """Return once the broker's metadata shows every partition of ``wanted`` with a leader.

    CreateTopics succeeds when the controller has committed the topics; a broker may serve
    metadata without them (or without leaders) a moment longer, longest on a broker just
    started, and each broker of a cluster learns of them on its own. A stage started in
    that moment refuses to run (missing topics), and a producer's first batch to a
    leaderless partition fails, is retried, and -- without idempotence -- lands after the
    batches sent behind it (out of order).
    """
    deadline = time.monotonic() + timeout
    while True:
        unread: KafkaException | None = None
        try:
            topics = admin.list_topics(timeout=5).topics
        except KafkaException as exc:
            topics, unread = {}, exc
        waiting = sorted(
            name for name, n in wanted.items()
            if name not in topics or topics[name].error is not None
            or len(topics[name].partitions) < n
            or any(p.leader < 0 or p.error is not None
                   for p in topics[name].partitions.values()))
        if not waiting:
            return
        if time.monotonic() > deadline:
            if unread is not None:
                raise ServiceUnavailable(
                    f"topics created, but the broker's metadata is unreadable: {unread}")
            raise ServiceUnavailable(
                f"topics created but without a leader after {timeout:g} s: "
                f"{', '.join(waiting[:5])}{' ...' if len(waiting) > 5 else ''}")
        time.sleep(0.1)


def verify_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> list[Drift]:
    """Compare the broker with the registry and the replication settings: missing topics,
    partition counts, replicas per partition, ``min.insync.replicas``, the cleanup policy
    and every config the registry sets (retention)."""
    admin = _admin(settings)
    md = _metadata(admin)
    drifts: list[Drift] = []
    present: list[TopicSpec] = []
    for s in _specs(specs):
        name = settings.topic(s.base)
        topic = md.topics.get(name)
        if topic is None:
            drifts.append(Drift(name, "missing (run `postbacks topics create`)"))
            continue
        if len(topic.partitions) != s.partitions:
            drifts.append(Drift(name, f"{len(topic.partitions)} partitions, registry says "
                                      f"{s.partitions}"))
        replicas = sorted({len(p.replicas) for p in topic.partitions.values()})
        if replicas and replicas != [settings.replication_factor]:
            drifts.append(Drift(name, f"replication factor {'/'.join(map(str, replicas))}, "
                                      f"settings say {settings.replication_factor} "
                                      f"(POSTBACKS_KAFKA_REPLICATION="
                                      f"{settings.kafka_replication})"))
        present.append(s)
    if not present:
        return drifts
    by_name = {settings.topic(s.base): s for s in present}
    futures = admin.describe_configs([ConfigResource("topic", n) for n in by_name],
                                     request_timeout=30)
    for res, fut in futures.items():
        try:
            actual = fut.result()
        except KafkaException as exc:
            raise ServiceUnavailable(f"cannot read the configs of {res.name}: {exc}") from exc
        for key, want in wanted_configs(settings, by_name[res.name]).items():
            got = actual[key].value if key in actual else None
            if got != want:
                drifts.append(Drift(res.name, f"config {key}={got!r}, "
                                              f"{_source(key)} says {want!r}"))
        limit = actual["max.message.bytes"].value if "max.message.bytes" in actual else None
        if limit is not None and limit.isdigit() and int(limit) < BATCH_MAX:
            drifts.append(Drift(res.name, (
                f"config max.message.bytes={limit!r} is under the {BATCH_MAX:,} bytes a "
                "producer's record batch may take: the broker refuses a bigger batch, and a "
                "stage's transaction holding it aborts, at every retry (raise it to at "
                f"least {BATCH_MAX})")))
    return sorted(drifts, key=lambda d: (d.topic, d.problem))


# librdkafka's batch.size (1,000,000 bytes, framing included; the stages' producers keep
# it): what the broker must take in one record batch
BATCH_MAX = 1_000_000


def _source(key: str) -> str:
    return "settings" if key == "min.insync.replicas" else "registry"


def under_replicated(settings: Settings, specs: list[TopicSpec] | None = None
                     ) -> dict[str, int]:
    """Topic -> how many of its partitions have fewer in-sync replicas than replicas (a
    broker down or catching up); topics with none are left out. Not drift: it heals."""
    md = _metadata(_admin(settings))
    out: dict[str, int] = {}
    for s in _specs(specs):
        topic = md.topics.get(settings.topic(s.base))
        if topic is None:
            continue
        n = sum(1 for p in topic.partitions.values() if len(p.isrs) < len(p.replicas))
        if n:
            out[topic.topic] = n
    return out


def delete_prefixed_topics(settings: Settings, prefix: str, timeout: float = 30.0) -> int:
    """Delete every topic whose name starts with ``prefix`` (a test's or a benchmark's
    namespace, Faust changelogs included); returns how many were deleted. Refuses an empty
    prefix."""
    if not prefix:
        raise ValueError("refusing to delete topics without a prefix")
    admin = _admin(settings)
    names = [t for t in _metadata(admin).topics if t.startswith(prefix)]
    if not names:
        return 0
    futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
    deleted = 0
    for fut in futures.values():
        try:
            fut.result()
            deleted += 1
        except KafkaException:
            pass  # already gone, or the broker is down: nothing to keep tidy
    return deleted
