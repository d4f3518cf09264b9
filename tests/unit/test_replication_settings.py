"""Replication settings: the cluster default, the explicit development mode, overrides and
the values refused; the topics and clients built from them."""

from __future__ import annotations

import pytest

from postbacks.errors import ConfigError
from postbacks.settings import load_settings
from streams.anomaly_gate import runner
from streams.anomaly_gate.startup import faust_settings
from topics import GATE_APP, TOPICS, all_topics, internal_topics
from topics.admin import wanted_configs


@pytest.mark.parametrize(("env", "rf", "min_isr"), [
    ({}, 3, 2),  # no setting: a cluster
    ({"POSTBACKS_KAFKA_REPLICATION": "cluster"}, 3, 2),
    ({"POSTBACKS_KAFKA_REPLICATION": "dev"}, 1, 1),
    ({"POSTBACKS_KAFKA_REPLICATION_FACTOR": "5"}, 5, 2),
    ({"POSTBACKS_KAFKA_REPLICATION_FACTOR": "5", "POSTBACKS_KAFKA_MIN_INSYNC_REPLICAS": "3"}, 5, 3),
    ({"POSTBACKS_KAFKA_REPLICATION": "dev", "POSTBACKS_KAFKA_REPLICATION_FACTOR": "2"}, 2, 1),
])
def test_replication_factor_and_min_isr(env: dict[str, str], rf: int, min_isr: int) -> None:
    s = load_settings(env)
    assert (s.replication_factor, s.min_insync_replicas) == (rf, min_isr)
    assert s.kafka_acks == "all"


@pytest.mark.parametrize(("env", "message"), [
    ({"POSTBACKS_KAFKA_REPLICATION": "single"}, "POSTBACKS_KAFKA_REPLICATION.*cluster.*dev"),
    ({"POSTBACKS_KAFKA_REPLICATION": "dev", "POSTBACKS_KAFKA_MIN_INSYNC_REPLICAS": "2"},
     "min.insync.replicas 2 is more than the replication factor 1"),
    ({"POSTBACKS_KAFKA_REPLICATION_FACTOR": "-1"}, "must be >= 0"),
    ({"POSTBACKS_KAFKA_ACKS": "1"}, "POSTBACKS_KAFKA_ACKS.*only all"),
    ({"POSTBACKS_KAFKA_REPLICATION_FACTOR": "three"}, "POSTBACKS_KAFKA_REPLICATION_FACTOR"),
])
def test_bad_replication_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(env)


def test_every_topic_is_created_with_the_settings_min_isr_and_its_cleanup_policy() -> None:
    for mode, isr in (("cluster", "2"), ("dev", "1")):
        s = load_settings({"POSTBACKS_KAFKA_REPLICATION": mode})
        for spec in (*all_topics(), *internal_topics()):
            conf = wanted_configs(s, spec)
            assert conf["min.insync.replicas"] == isr, spec.base
            assert conf["cleanup.policy"] == spec.configs.get("cleanup.policy", "delete")
            assert {k: conf[k] for k in spec.configs} == spec.configs  # retention kept
    assert wanted_configs(s, TOPICS.anomaly_control)["cleanup.policy"] == "compact"


def test_producers_use_acks_all(monkeypatch: pytest.MonkeyPatch) -> None:
    from postbacks.kafka import clients

    seen: dict[str, object] = {}

    class Fake:
        def __init__(self, conf: dict[str, object]) -> None:
            seen.update(conf)

    monkeypatch.setattr(clients, "Producer", Fake)
    clients.make_producer(load_settings({}))
    assert seen["acks"] == "all" and seen["enable.idempotence"] is True


@pytest.mark.parametrize("mode", ["cluster", "dev"])
def test_the_gates_faust_app_uses_the_same_replication(mode: str) -> None:
    s = load_settings({"POSTBACKS_KAFKA_REPLICATION": mode})
    conf = faust_settings(s)
    assert conf["topic_replication_factor"] == s.replication_factor
    assert conf["producer_acks"] == -1


def test_the_gates_changelogs_are_the_registrys() -> None:
    """Faust names a table's changelog ``<app id>-<table>-changelog``; the registry's
    internal topics must be exactly the gate's, partitions included."""
    import faust

    s = load_settings({"POSTBACKS_KAFKA_REPLICATION": "dev", "POSTBACKS_TOPIC_PREFIX": "x."})
    assert runner.GROUP == GATE_APP
    app = faust.App(s.topic(runner.GROUP), **faust_settings(s))
    for table, spec in ((runner.EP_TABLE, TOPICS.gate_endpoints_changelog),
                        (runner.G_TABLE, TOPICS.gate_global_changelog)):
        t = app.Table(table, default=None, partitions=spec.partitions)
        assert t.changelog_topic.get_topic_name() == s.topic(spec.base)
        assert spec.configs["cleanup.policy"] == "compact"
    assert TOPICS.gate_endpoints_changelog.partitions == TOPICS.deliveries.partitions
    assert TOPICS.gate_global_changelog.partitions == TOPICS.anomaly_partials.partitions


def test_the_demo_selects_the_single_broker_mode_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from postbacks.tools.demo import demo_replication

    monkeypatch.delenv("POSTBACKS_KAFKA_REPLICATION", raising=False)
    assert demo_replication(load_settings({})).replication_factor == 1
    monkeypatch.setenv("POSTBACKS_KAFKA_REPLICATION", "cluster")
    assert demo_replication(load_settings({})).replication_factor == 3


def test_the_local_services_and_ci_select_the_single_broker_mode() -> None:
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["bash", str(root / "deploy/local/services.sh"), "env"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert "export POSTBACKS_KAFKA_REPLICATION=dev" in out.splitlines()
    out = subprocess.run(["bash", str(root / "deploy/local/services.sh"), "cluster", "env"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert "export POSTBACKS_KAFKA_REPLICATION=cluster" in out.splitlines()
    assert "export POSTBACKS_KAFKA_REPLICATION=dev" in (root / ".ci/run").read_text()
