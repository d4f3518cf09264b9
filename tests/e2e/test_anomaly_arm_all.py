"""Arming at scale through the real gate, Kafka and PostgreSQL: one audited row
(``postbacks anomaly set-mode --scope endpoint --all-endpoints``) arms the retrodating
guard for every endpoint, including one created after it; an endpoint's own row
overrides it. Its own database: the ``*`` row arms every endpoint it can see."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from postbacks.settings import Settings
from postbacks.tools.procs import Stack
from tests.e2e.harness import Harness
from tests.integration.anomaly_helpers import run_cli
from tests.kafka_util import scalar

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000


def test_one_row_arms_every_endpoint_and_an_override_wins(
    settings: Settings, own_database: str, stack_env: dict[str, str], namespace: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    settings = dataclasses.replace(settings, database_url=own_database)
    env = {**stack_env, "POSTBACKS_DATABASE_URL": own_database}
    with Stack(env, ROOT / ".local" / "test-logs" / namespace) as stack:
        h = Harness(settings, stack, namespace)
        h.start_receiver()
        over = h.endpoint("over")
        assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "endpoint",
                       "--all-endpoints", "--detector", "retrodating", "--mode", "enforce",
                       "--actor", "alice", "--note", "arm everyone") == 0
        assert "endpoint/*/retrodating: mode enforce" in capsys.readouterr().out
        assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "endpoint",
                       "--key", over, "--detector", "retrodating", "--mode", "off",
                       "--actor", "alice", "--note", "this one is exempt") == 0
        assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "global",
                       "--all-endpoints", "--detector", "retrodating", "--mode", "enforce",
                       "--actor", "alice") == 2
        assert "--all-endpoints goes with --scope endpoint" in capsys.readouterr().err
        fresh = h.endpoint("fresh")  # created after the arming: it follows it
        h.start_stages()

        now_ms = h.scalar("SELECT (extract(epoch FROM now()) * 1000)::bigint")
        retro = {"source_created_at": now_ms, "source_completed_at": now_ms - 30 * DAY_MS}
        h.emit("fresh", 3, **retro)
        h.emit("over", 3, **retro)
        h.emit("fresh", 1)  # not retrodated: delivered
        h.wait_status(fresh, "held", 3)
        h.wait_status(over, "delivered", 3)
        h.wait_status(fresh, "delivered", 1)
        assert h.scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = %s"
                        " AND hold_reason = 'retrodated'", (fresh,)) == 3
        assert {r["endpoint_id"] for r in h.received()} == {fresh, over}
        assert len(h.received(fresh)) == 1
    assert scalar(settings, "SELECT count(*) FROM audit_log WHERE action = 'anomaly.set_mode'"
                  " AND target_id LIKE %s AND actor = 'alice'", ("endpoint/*/%",)) == 1
    assert run_cli(monkeypatch, settings, "anomaly", "status") == 0
    assert "* (every endpoint)" in capsys.readouterr().out
