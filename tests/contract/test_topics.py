"""The topic registry is the single source: DESIGN's topics, keyed and co-partitioned."""

from __future__ import annotations

from postbacks.codec import load_schema_versions
from topics import RETRY_TIERS, TOPICS, all_topics

DESIGN_TOPICS = {
    "conversions.v1", "deliveries.v1", "dispatch.v1", "held.v1", "quarantine.v1", "dlq.v1",
    "attempts.v1", "outcomes.v1", "anomaly.control.v1",
    "anomaly.partials.v1",  # DESIGN: "partial sums to a single-partition topic"
    "operations.v1",  # the SRE surface: operational events and owner notifications
} | {f"retry.{t}.v1" for t in ("5s", "30s", "2m", "10m", "1h", "6h")}


def test_registry_has_exactly_the_designed_topics() -> None:
    names = [t.base for t in all_topics()]
    assert len(names) == len(set(names))
    assert set(names) == DESIGN_TOPICS


def test_every_topic_carries_a_known_record() -> None:
    known = load_schema_versions()
    for t in all_topics():
        assert t.record in known, t.base


def test_delivery_topics_are_co_partitioned_and_keyed_by_endpoint() -> None:
    delivery = [t for t in all_topics() if t.record == "Delivery"]
    assert {t.partitions for t in delivery} == {TOPICS.deliveries.partitions}
    assert {t.key for t in delivery} == {"endpoint_id"}
    assert TOPICS.conversions.partitions == TOPICS.deliveries.partitions


def test_retry_tiers_increase_and_resolve() -> None:
    delays = [s for _, s in RETRY_TIERS]
    assert delays == sorted(delays) and delays[-1] == 6 * 3600
    assert TOPICS.retry_tier("30s").base == "retry.30s.v1"


def test_control_topic_is_compacted() -> None:
    assert TOPICS.anomaly_control.configs["cleanup.policy"] == "compact"


def test_the_registry_names_every_stages_group_and_inputs() -> None:
    """The monitor measures the groups in GROUPS: they must be the ones the stages use."""
    from postbacks.settings import load_settings
    from sinks import postgres
    from streams import agent, fanout, notifier, relay
    from streams.anomaly_gate import runner
    from topics import GROUPS

    by_stage = {g.stage: g for g in GROUPS}
    assert {s: g.base for s, g in by_stage.items()} == {
        "fanout": fanout.GROUP, "gate": runner.GROUP, "agent": agent.GROUP,
        "relay": relay.GROUP, "sink": postgres.GROUP, "notifier": notifier.GROUP}
    settings = load_settings({})
    assert set(postgres.PostgresSink(settings).topics) == set(by_stage["sink"].inputs)
    assert by_stage["sink"].offsets == "postgres"
    assert {g.offsets for s, g in by_stage.items() if s != "sink"} == {"kafka"}
    assert set(by_stage["relay"].inputs) == {t.base for t in (*TOPICS.retry, TOPICS.quarantine)}
    assert by_stage["notifier"].inputs == notifier.INPUTS
