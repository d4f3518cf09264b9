"""The product's alert rules in a real Prometheus (Debian's server) scraping every running
process: three faults -- a stalled agent, an endpoint that answers 503, a held cohort --
each take their alert to firing, and recovery resolves it.

The rules are the product's ``deploy/prometheus/rules.yml`` as written, except that the
three alerts' ``for`` is cut to a few seconds so the test takes a minute, not an hour. The
stack runs on its own database, so held rows and gaps of other tests cannot fire or hold
an alert here. Every process's page also passes ``promtool check metrics``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from tests.e2e.harness import STAGES, Harness, metrics_target

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000
SHORT_FOR = {"PostbacksStageDown": "5s", "PostbacksBreakerOpen": "3s",
             "PostbacksDeliveriesHeld": "3s"}


def _rules_with_short_for(out: Path) -> Path:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in SHORT_FOR:
                rule["for"] = SHORT_FOR[rule["alert"]]
    path = out / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    return path


def _console_target(log_path: Path, timeout: float = 60) -> str:
    def found() -> str | None:
        urls = re.findall(r"console on http://(\S+?)/", log_path.read_text(errors="replace"))
        return urls[-1] if urls else None
    target: str = wait_for(found, timeout, what="the console's address")
    return target


def _alerts(base: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=5) as r:
        return list(json.loads(r.read())["data"]["alerts"])


def _state(base: str, name: str, **labels: str) -> str | None:
    for a in _alerts(base):
        if a["labels"].get("alertname") == name and all(
                a["labels"].get(k) == v for k, v in labels.items()):
            return str(a["state"])
    return None


def _lint(target: str) -> None:
    path = "/metrics"
    with urllib.request.urlopen(f"http://{target}{path}", timeout=5) as r:
        page = r.read()
    lint = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True,
                          timeout=30, check=False)
    assert lint.returncode == 0, (target, lint.stdout.decode() + lint.stderr.decode())


def test_three_faults_fire_their_alerts_and_recovery_resolves_them(
    settings: Settings, own_database: str, stack_env: dict[str, str], namespace: str,
    tmp_path: Path,
) -> None:
    s = dataclasses.replace(settings, database_url=own_database)
    env = {**stack_env, "POSTBACKS_DATABASE_URL": own_database,
           "POSTBACKS_BREAKER_FAILURE_THRESHOLD": "3", "POSTBACKS_BREAKER_OPEN_S": "8",
           "POSTBACKS_BREAKER_RAMP_S": "1", "POSTBACKS_RETRY_BASE_S": "1",
           "POSTBACKS_MONITOR_INTERVAL_S": "1"}
    with Stack(env, ROOT / ".local" / "test-logs" / namespace) as stack:
        h = Harness(s, stack, namespace)
        h.start_receiver()
        h.endpoint("ok")
        down = h.endpoint("down", concurrency=1)
        cohort = h.endpoint("cohort")
        with connect(own_database) as conn:
            set_mode(conn, scope="endpoint", scope_key=cohort, detector="retrodating",
                     mode="enforce", actor="test", note="alerts e2e")
            conn.commit()
        h.start_stages()
        stack.start("monitor", "monitor")
        stack.start_listening("console", "console", "serve", "--port", "{port}",
                              ready=lambda p: http_json(f"http://127.0.0.1:{p}/healthz"))
        targets = {name: metrics_target(stack.procs[name].log_path)
                   for name in (*STAGES, "monitor")}
        targets["console"] = _console_target(stack.procs["console"].log_path)

        for target in targets.values():
            _lint(target)

        prom_port = free_port()
        config = {
            # a 2-s scrape timeout: a busy process on 2 loaded cores still answers in time
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(_rules_with_short_for(tmp_path))],
            "scrape_configs": [{"job_name": f"postbacks-{name}",
                                "static_configs": [{"targets": [t]}]}
                               for name, t in targets.items()],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=(tmp_path / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{prom_port}"
        try:
            wait_for(lambda: _alerts(base) is not None, 60, what="Prometheus's API")
            h.emit("ok", 5)
            wait_for(lambda: len(h.received()) >= 5, 90, what="the healthy deliveries")
            for a in _alerts(base):
                assert a["state"] != "firing", a  # a healthy pipeline fires nothing

            # 1. a stalled agent: its scrapes time out
            agent = stack.procs["agent"]
            os.kill(agent.pid, signal.SIGSTOP)
            try:
                wait_for(lambda: _state(base, "PostbacksStageDown",
                                        job="postbacks-agent") == "firing", 60,
                         what="PostbacksStageDown firing for the stalled agent")
            finally:
                os.kill(agent.pid, signal.SIGCONT)
            wait_for(lambda: _state(base, "PostbacksStageDown") is None, 60,
                     what="PostbacksStageDown resolved")

            # 2. an endpoint answering 503: its breaker opens
            h.script(down, statuses=[503] * 1000)
            h.emit("down", 6)
            wait_for(lambda: _state(base, "PostbacksBreakerOpen", endpoint=down) == "firing",
                     120, what="PostbacksBreakerOpen firing")
            h.script(down, statuses=[200] * 1000)
            wait_for(lambda: _state(base, "PostbacksBreakerOpen") is None, 120,
                     what="PostbacksBreakerOpen resolved once the endpoint answers")

            # 3. a retrodated cohort held by the gate, then released by a reviewer
            h.emit("cohort", 4, source_completed_at=int(time.time() * 1000) - 30 * DAY_MS)
            wait_for(lambda: _state(base, "PostbacksDeliveriesHeld") == "firing", 120,
                     what="PostbacksDeliveriesHeld firing")
            released = subprocess.run(
                [sys.executable, "-m", "postbacks", "held", "release", "--endpoint", cohort,
                 "--actor", "reviewer@test", "--note", "checked"],
                env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
                check=False)
            assert released.returncode == 0, released.stdout + released.stderr
            wait_for(lambda: _state(base, "PostbacksDeliveriesHeld") is None, 60,
                     what="PostbacksDeliveriesHeld resolved after the release")
            wait_for(lambda: len(h.received(cohort)) >= 4, 90, what="the released cohort")
        finally:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
            if sys.exc_info()[0] is not None:
                print((tmp_path / "prometheus.log").read_text(errors="replace")[-3000:])
