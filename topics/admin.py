"""Create and verify the registry's topics on a broker (idempotent), reporting drift."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from postbacks.errors import ServiceUnavailable
from postbacks.settings import Settings
from topics.registry import TopicSpec, all_topics

__all__ = ["Drift", "create_topics", "verify_topics"]


@dataclass(frozen=True, slots=True)
class Drift:
    topic: str
    problem: str

    def __str__(self) -> str:
        return f"{self.topic}: {self.problem}"


def _admin(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})


def _existing(admin: AdminClient, timeout: float = 15.0) -> dict[str, int]:
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise ServiceUnavailable(f"Kafka metadata request failed: {exc}") from exc
    return {name: len(t.partitions) for name, t in md.topics.items()}


def create_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create missing topics; returns the names created. Existing topics are left as they are."""
    admin = _admin(settings)
    existing = _existing(admin)
    wanted = [s for s in (specs or all_topics()) if settings.topic(s.base) not in existing]
    if not wanted:
        return []
    futures = admin.create_topics(
        [
            NewTopic(settings.topic(s.base), s.partitions, 1, config=dict(s.configs))
            for s in wanted
        ],
        operation_timeout=30,
        request_timeout=30,
    )
    created: list[str] = []
    for name, fut in futures.items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
                continue
            raise ServiceUnavailable(f"cannot create topic {name}: {exc}") from exc
    _wait_led(admin, {settings.topic(s.base): s.partitions for s in wanted})
    return created


def _wait_led(admin: AdminClient, wanted: dict[str, int], timeout: float = 30.0) -> None:
    """Return once the broker's metadata shows every partition of ``wanted`` with a leader.

    CreateTopics succeeds when the controller has committed the topics; the broker may serve
    metadata without them (or without leaders) a moment longer, longest on a broker just
    started. A stage started in that moment refuses to run (missing topics), and a
    producer's first batch to a leaderless partition fails, is retried, and -- without
    idempotence -- lands after the batches sent behind it (out of order).
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
    """Compare the broker with the registry: missing topics, partition counts, configs."""
    admin = _admin(settings)
    existing = _existing(admin)
    drifts: list[Drift] = []
    present: list[TopicSpec] = []
    for s in specs or all_topics():
        name = settings.topic(s.base)
        if name not in existing:
            drifts.append(Drift(name, "missing (run `postbacks topics create`)"))
            continue
        if existing[name] != s.partitions:
            drifts.append(Drift(name, f"{existing[name]} partitions, registry says {s.partitions}"))
        present.append(s)
    resources = [ConfigResource("topic", settings.topic(s.base)) for s in present if s.configs]
    if resources:
        for res, fut in admin.describe_configs(resources, request_timeout=30).items():
            spec = next(s for s in present if settings.topic(s.base) == res.name)
            actual = fut.result()
            for key, want in spec.configs.items():
                got = actual[key].value if key in actual else None
                if got != want:
                    drifts.append(Drift(res.name, f"config {key}={got!r}, registry says {want!r}"))
    return drifts


def delete_prefixed_topics(settings: Settings, prefix: str, timeout: float = 30.0) -> int:
    """Delete every topic whose name starts with ``prefix`` (a test's or a benchmark's
    namespace, Faust changelogs included); returns how many were deleted. Refuses an empty
    prefix."""
    if not prefix:
        raise ValueError("refusing to delete topics without a prefix")
    admin = _admin(settings)
    names = [t for t in _existing(admin) if t.startswith(prefix)]
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
