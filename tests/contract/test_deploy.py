"""deploy/: the Kubernetes manifests validate offline against the Kubernetes schemas, cover
every stage, and the compose file runs a three-broker cluster with RF 3 / min ISR 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from postbacks.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.30.0"
STAGES = {"fanout", "gate", "agent", "relay", "sink", "console", "monitor", "notifier"}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_validates_against_the_kubernetes_schemas(path: Path) -> None:
    for doc in _docs(path):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises on a bad field


def test_the_validator_rejects_a_bad_manifest() -> None:
    """The check above can fail: an unknown field and a wrong type are errors."""
    doc = _docs(K8S / "gate.yaml")[0]
    doc["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    doc = _docs(K8S / "gate.yaml")[0]
    doc["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _all() -> list[dict[str, Any]]:
    return [d for p in MANIFESTS for d in _docs(p)]


def test_one_deployment_per_stage_with_probes_resources_config_and_secrets() -> None:
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    deployments = {d["metadata"]["name"].removeprefix("postbacks-"): d
                   for d in _all() if d["kind"] == "Deployment"}
    assert set(deployments) == STAGES
    assert commands >= STAGES  # every Deployment runs a real `postbacks` command
    for stage, d in deployments.items():
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert c["args"][0] == stage
        assert c.get("readinessProbe") and c.get("livenessProbe"), stage
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), stage
        assert {"cpu", "memory"} <= set(c["resources"]["limits"]), stage
        refs = {next(iter(r)): next(iter(r.values()))["name"] for r in c["envFrom"]}
        assert refs == {"configMapRef": "postbacks-config", "secretRef": "postbacks-secrets"}
        ids = [e for e in c["env"] if e["name"] == "POSTBACKS_INSTANCE_ID"]
        assert ids and ids[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", stage


def test_config_selects_cluster_replication_and_secrets_hold_the_keys() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in _all()}
    config = kinds[("ConfigMap", "postbacks-config")]["data"]
    assert config["POSTBACKS_KAFKA_REPLICATION"] == "cluster"
    assert len(config["KAFKA_BOOTSTRAP_SERVERS"].split(",")) == 3
    secret = kinds[("Secret", "postbacks-secrets")]["stringData"]
    assert {"POSTBACKS_DATABASE_URL", "POSTBACKS_IDEMPOTENCY_KEY",
            "POSTBACKS_SECRETS_KEY"} <= set(secret)


def test_every_multi_instance_stage_has_a_disruption_budget() -> None:
    docs = _all()
    pdbs = {d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
            for d in docs if d["kind"] == "PodDisruptionBudget"}
    multi = {d["metadata"]["name"].removeprefix("postbacks-") for d in docs
             if d["kind"] == "Deployment" and d["spec"]["replicas"] > 1}
    assert multi and multi <= pdbs


def test_the_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in MANIFESTS}


def test_compose_names_three_brokers_with_rf3_and_min_isr_2() -> None:
    services = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]
    brokers = {n: s for n, s in services.items() if "apache/kafka" in str(s.get("image"))}
    assert len(brokers) == 3
    ids = {s["environment"]["KAFKA_NODE_ID"] for s in brokers.values()}
    assert ids == {"1", "2", "3"}
    for s in brokers.values():
        env = s["environment"]
        assert len(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == 3
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
    stage_env = services["fanout"]["environment"]
    assert stage_env["POSTBACKS_KAFKA_REPLICATION"] == "cluster"
    assert len(stage_env["KAFKA_BOOTSTRAP_SERVERS"].split(",")) == 3


def test_every_stage_is_scraped_where_it_runs() -> None:
    """Each pod listens on 0.0.0.0 and says where (annotations), and the k8s scrape
    configuration turns the component into the job name the rules expect; compose's
    prometheus scrapes each stage service on its fixed port. (Every stage listened on
    127.0.0.1 only: nothing outside its pod or container could scrape it.)"""
    import re

    config = {(d["kind"], d["metadata"]["name"]): d for d in _all()}[
        ("ConfigMap", "postbacks-config")]["data"]
    assert config["POSTBACKS_METRICS_HOST"] == "0.0.0.0"
    for d in _all():
        if d["kind"] != "Deployment":
            continue
        note = d["spec"]["template"]["metadata"]["annotations"]
        (c,) = d["spec"]["template"]["spec"]["containers"]
        ports = {p["containerPort"] for p in c.get("ports", [])}
        assert note["prometheus.io/scrape"] == "true" and int(note["prometheus.io/port"]) in ports
    prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus-k8s.yml").read_text())
    relabels = prom["scrape_configs"][0]["relabel_configs"]
    job = next(r for r in relabels if r.get("target_label") == "job")
    component = "agent"
    assert re.sub(job["regex"], job["replacement"].replace("$1", r"\1"), component) == \
        "postbacks-agent"
    # a pod that ended (an evicted one keeps its IP) is not scraped as a stage down
    phase = next(r for r in relabels if r.get("source_labels") == ["__meta_kubernetes_pod_phase"])
    assert phase["action"] == "drop"
    assert all(re.fullmatch(phase["regex"], p) for p in ("Failed", "Succeeded", "Pending"))
    assert not re.fullmatch(phase["regex"], "Running")
    services = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]
    stages = {n for n, s in services.items()
              if re.search(r"postbacks (fanout|gate|agent|relay|sink|monitor|notifier"
                           r"|console serve)\W*$",
                           str(s.get("command", "")))}
    compose_prom = yaml.safe_load((ROOT / "deploy/prometheus/prometheus-compose.yml").read_text())
    targets = {t.split(":")[0] for j in compose_prom["scrape_configs"]
               for sc in j["static_configs"] for t in sc["targets"]}
    assert stages and targets == stages
    env = services["fanout"]["environment"]
    assert env["POSTBACKS_METRICS_HOST"] == "0.0.0.0" and env["POSTBACKS_METRICS_PORT"] == "9100"
    assert "prometheus" in services
