"""The SRE surface as code: the alert rules pass promtool's checks and unit tests, every
alert has a firing and a silent case and a runbook, and every query in the rules and the
Grafana dashboard is valid PromQL naming only metrics the product exports.

promtool comes from Debian's ``prometheus`` package (``make prometheus``); a missing
promtool fails these tests.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

import postbacks.metrics  # noqa: F401  (registers every metric the product exports)

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/rules.yml"
RULE_TESTS = ROOT / "deploy/prometheus/tests/rules_test.yml"
DASHBOARDS = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
RUNBOOK_SECTIONS = ("## What it means", "## How to confirm", "## What to do", "## How to undo")

# PromQL words that are not metric names.
_WORDS = frozenset((
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
    "group_right", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
    "quantile", "count_values", "group", "rate", "irate", "increase", "delta", "idelta",
    "deriv", "predict_linear", "histogram_quantile", "abs", "absent", "absent_over_time",
    "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max", "changes", "resets", "time",
    "timestamp", "vector", "scalar", "sort", "sort_desc", "label_replace", "label_join", "sgn",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "quantile_over_time", "last_over_time", "present_over_time", "stddev_over_time",
))


def metric_names(expr: str) -> set[str]:
    """The metric (and recording-rule) names a PromQL expression reads."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\boffset\s+\w+", "", e)
    e = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", "", e)
    return {t for t in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e) if t not in _WORDS}


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _exported() -> set[str]:
    recorded = {r["record"] for r in _rules() if "record" in r}
    return set(REGISTRY._names_to_collectors) | recorded | {"up"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120,
                          check=False, cwd=ROOT)


def test_promtool_accepts_the_rules_and_the_scrape_config() -> None:
    for args in (("check", "rules", str(RULES)),
                 ("check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")),
                 ("check", "config", str(ROOT / "deploy/prometheus/prometheus-compose.yml"))):
        done = _promtool(*args)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_unit_tests_pass() -> None:
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    assert {a: cases.get(a, set()) for a in alerts} == {a: {True, False} for a in alerts}


@pytest.mark.parametrize("rule", [r for r in _rules() if "alert" in r], ids=lambda r: r["alert"])
def test_every_alert_links_its_runbook(rule: dict[str, Any]) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url == f"docs/runbooks/{rule['alert']}.md"
    text = (ROOT / url).read_text()
    assert text.startswith(f"# {rule['alert']}\n")
    for section in RUNBOOK_SECTIONS:
        assert section in text, f"{url} lacks {section!r}"
    assert rule["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("alert") or r["record"])
def test_rules_name_only_metrics_the_product_exports(rule: dict[str, Any]) -> None:
    assert metric_names(rule["expr"]) - _exported() == set()


def _panel_exprs(dashboard: dict[str, Any]) -> list[str]:
    out: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            out.extend(t["expr"] for t in p.get("targets", []) if t.get("expr"))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    return out


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_is_valid_promql_on_exported_metrics(path: Path,
                                                                  tmp_path: Path) -> None:
    exprs = _panel_exprs(json.loads(path.read_text()))
    assert len(exprs) >= 10, "the dashboard has fewer panels than its rows promise"
    generated = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:panel_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    rules = tmp_path / "dashboard_rules.yml"
    rules.write_text(yaml.safe_dump(generated))
    done = _promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    unknown = {e: metric_names(e) - _exported() for e in exprs}
    assert {e: u for e, u in unknown.items() if u} == {}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_has_its_own_id(path: Path) -> None:
    """A shared id makes a panel link (``viewPanel=<id>``) open the wrong panel."""
    ids: list[Any] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            ids.append(panel.get("id"))
            walk(panel.get("panels", []))

    walk(json.loads(path.read_text())["panels"])
    assert None not in ids
    assert sorted(i for i in set(ids) if ids.count(i) > 1) == []


def test_the_dashboards_exist() -> None:
    assert DASHBOARDS, "deploy/grafana/dashboards/*.json is missing"


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (group, topic) (rate(x_total{a="b"}[5m])) > 10', {"x_total"}),
    ("a:b:c / on (job) group_left (instance) up", {"a:b:c", "up"}),
    ('histogram_quantile(0.99, sum by (le) (rate(lat_bucket[5m])))', {"lat_bucket"}),
    ("time() - max(ts_seconds offset 5m) > 1e3", {"ts_seconds"}),
])
def test_metric_names_reads_what_a_query_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_an_unexported_metric_is_caught() -> None:
    assert metric_names("rate(webhook_no_such_metric_total[5m])") - _exported() == {
        "webhook_no_such_metric_total"}
