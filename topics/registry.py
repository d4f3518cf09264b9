"""The one registry of topics: names, partitions, configs and the record each carries.

No topic string appears anywhere else in the code; stages ask for ``TOPICS.<name>`` and
prefix it with :meth:`Settings.topic`. ``deploy/`` and the tests read this module too (a
contract test keeps DESIGN's topic list, the record schemas and this registry in step).

Every delivery topic is keyed by ``endpoint_id`` and shares one partition count, so the
same endpoint lands on the same partition number everywhere (the anomaly gate relies on
that co-partitioning).

Replication is not the registry's: every topic gets the replication factor and
``min.insync.replicas`` of the settings (``POSTBACKS_KAFKA_REPLICATION``), the same on
every topic, so one broker down never stops one topic while the others go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GATE_APP", "GROUPS", "RETRY_TIERS", "TOPICS", "GroupSpec", "TopicSpec", "all_topics",
           "internal_topics"]

DELIVERY_PARTITIONS = 6
WEEK_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    base: str
    record: str
    partitions: int
    key: str
    doc: str
    configs: dict[str, str] = field(default_factory=dict)


def _delivery_topic(base: str, doc: str, **configs: str) -> TopicSpec:
    return TopicSpec(base, "Delivery", DELIVERY_PARTITIONS, "endpoint_id", doc, dict(configs))


# The anomaly gate's Faust app id: its consumer group and the first part of its tables'
# changelog topic names (Faust names them ``<app id>-<table>-changelog``), prefixed like a
# topic.
GATE_APP = "postbacks-gate"


def _changelog(table: str, partitions: int, doc: str) -> TopicSpec:
    return TopicSpec(f"{GATE_APP}-{table}-changelog", "Faust table changelog (JSON)",
                     partitions, "scope key", doc, {"cleanup.policy": "compact"})


# Delay tiers of the retry schedule: (tier name, delay in seconds).
RETRY_TIERS: tuple[tuple[str, int], ...] = (
    ("5s", 5),
    ("30s", 30),
    ("2m", 120),
    ("10m", 600),
    ("1h", 3600),
    ("6h", 21600),
)


class _Topics:
    """Attribute access to every topic spec (class attributes; one shared instance)."""

    conversions: TopicSpec = TopicSpec(
        "conversions.v1", "ConversionEvent", DELIVERY_PARTITIONS, "conversion_id",
        "Upstream conversion events (input).",
        {"retention.ms": str(2 * WEEK_MS)},
    )
    deliveries: TopicSpec = _delivery_topic(
        "deliveries.v1", "Fan-out output: one delivery per subscribed endpoint."
    )
    dispatch: TopicSpec = _delivery_topic(
        "dispatch.v1", "Deliveries cleared to send now (gate and relay output)."
    )
    held: TopicSpec = _delivery_topic(
        "held.v1", "Deliveries held by the anomaly gate, with hold_reason."
    )
    quarantine: TopicSpec = _delivery_topic(
        "quarantine.v1", "Deliveries diverted from an endpoint with an open breaker or over "
        "budget, with due_at.",
    )
    attempts: TopicSpec = TopicSpec(
        "attempts.v1", "Attempt", DELIVERY_PARTITIONS, "endpoint_id",
        "One record per HTTP attempt, to the PostgreSQL sink.",
    )
    outcomes: TopicSpec = TopicSpec(
        "outcomes.v1", "Outcome", DELIVERY_PARTITIONS, "endpoint_id",
        "Terminal and state-change outcomes, for analytics and the sink.",
    )
    dlq: TopicSpec = TopicSpec(
        "dlq.v1", "DeadLetter", 3, "origin key",
        "Dead letters from every stage, with the original bytes.",
        {"retention.ms": str(4 * WEEK_MS)},
    )
    anomaly_control: TopicSpec = TopicSpec(
        "anomaly.control.v1", "BreakerState", 1, "scope/scope_key/detector",
        "Anomaly halt states (compacted).",
        {"cleanup.policy": "compact"},
    )
    # Not in all_topics() yet: each agent creates it at start (streams/breakers.py).
    breakers: TopicSpec = TopicSpec(
        "breakers.v1", "BreakerState", 1, "endpoint_id",
        "Endpoint circuit breakers (compacted): every agent's transitions, read by every agent.",
        {"cleanup.policy": "compact"},
    )
    # Not in all_topics() either: each agent creates it at start (streams/strict.py).
    ordering: TopicSpec = TopicSpec(
        "ordering.v1", "OrderState (JSON)", 1, "endpoint_id",
        "Strict-ordering endpoints' head-of-line state (compacted), written by the agent "
        "that owns the endpoint's partition, in its transaction.",
        {"cleanup.policy": "compact"},
    )
    anomaly_partials: TopicSpec = TopicSpec(
        "anomaly.partials.v1", "PayoutPartial", 1, "partition",
        "Per-partition cumulative payout partials, gate instances -> the one global aggregator.",
        {"retention.ms": str(WEEK_MS)},
    )
    operations: TopicSpec = TopicSpec(
        "operations.v1", "OperationalEvent", 3, "endpoint_id",
        "Operational events: first dead letter, endpoint disabled/enabled, breaker open long, "
        "anomaly trip (the notifier's input; for owners and operators).",
        {"retention.ms": str(4 * WEEK_MS)},
    )
    # Internal: the anomaly gate's table changelogs (compacted), created with the rest so
    # that they have the configured replication before the gate first starts.
    gate_endpoints_changelog: TopicSpec = _changelog(
        "gate-endpoints", DELIVERY_PARTITIONS,
        "The gate's per-endpoint anomaly state (co-partitioned with deliveries.v1).")
    gate_global_changelog: TopicSpec = _changelog(
        "gate-global", 1, "The gate's global payout roll-up state (one partition).")
    retry: tuple[TopicSpec, ...] = tuple(
        _delivery_topic(f"retry.{tier}.v1", f"Retry delay tier {tier} (due_at carried).")
        for tier, _ in RETRY_TIERS
    )


    def retry_tier(self, tier: str) -> TopicSpec:
        """The retry topic of a delay tier (see RETRY_TIERS)."""
        for spec in self.retry:
            if spec.base == f"retry.{tier}.v1":
                return spec
        raise KeyError(f"unknown retry tier {tier!r}")


TOPICS = _Topics()


def all_topics() -> list[TopicSpec]:
    """Every topic, in a stable order."""
    t = TOPICS
    return [
        t.conversions, t.deliveries, t.dispatch, t.held, *t.retry, t.quarantine,
        t.dlq, t.attempts, t.outcomes, t.anomaly_control, t.anomaly_partials, t.operations,
    ]


def internal_topics() -> list[TopicSpec]:
    """The topics the product's own machinery keeps (the gate's Faust changelogs): created
    and verified with :func:`all_topics`, named by no record schema."""
    return [TOPICS.gate_endpoints_changelog, TOPICS.gate_global_changelog]


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A stage's consumer group: its base name (prefixed like a topic), the topics it reads,
    and where its progress is kept (``kafka``: committed offsets; ``postgres``: the sink's
    ``sink_offsets`` rows, written in the same transaction as the rows they cover)."""

    stage: str
    base: str
    inputs: tuple[str, ...]
    offsets: str = "kafka"


def _groups() -> tuple[GroupSpec, ...]:
    t = TOPICS
    return (
        GroupSpec("fanout", "postbacks-fanout", (t.conversions.base,)),
        GroupSpec("gate", GATE_APP, (t.deliveries.base,)),
        GroupSpec("agent", "postbacks-agent", (t.dispatch.base,)),
        GroupSpec("relay", "postbacks-relay",
                  (*(s.base for s in t.retry), t.quarantine.base)),
        GroupSpec("notifier", "postbacks-notifier",
                  (t.dlq.base, t.outcomes.base, t.anomaly_control.base, t.operations.base)),
        GroupSpec("sink", "postbacks-sink",
                  (t.deliveries.base, t.attempts.base, t.outcomes.base, t.dlq.base),
                  offsets="postgres"),
    )


# Every stage's consumer group: what the monitor measures lag and backlog age against.
GROUPS: tuple[GroupSpec, ...] = _groups()
