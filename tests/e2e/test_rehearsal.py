"""Incident rehearsal through Kafka: a recorded history (two hours of event time, a
retrodated cohort inside it) fed by ``postbacks anomaly rehearse`` through the real
producer, paced at 3600x, runs through fan-out and the real gate under enforce: the normal
traffic is delivered, every retrodated event held."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack
from tests.e2e.harness import Harness
from tests.integration.anomaly_helpers import run_cli
from tests.unit.factories import make_conversion

DAY_MS, MIN_MS = 86_400_000, 60_000
T0 = 1_772_409_600_000  # 2026-03-02T00:00:00Z


def test_a_recorded_history_runs_through_the_real_gate_paced_by_event_time(
        settings: Settings, stack: Stack, namespace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ns = namespace
    app, ep = f"app_{ns}_0001", f"ep_{ns}_0001_1"
    events = []
    for i in range(60):  # one every 2 minutes for 2 hours
        at = T0 + i * 2 * MIN_MS
        retro = 30 <= i < 35
        events.append(make_conversion(
            event_id=f"evt_{i}", conversion_id=f"cv_{ns}_{i}", app_id=app, occurred_at=at,
            source_created_at=at, source_completed_at=at - (20 * DAY_MS if retro else MIN_MS)))
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))

    h = Harness(settings, stack, namespace)
    h.start_receiver()
    assert run_cli(monkeypatch, settings, "anomaly", "rehearse", "--file", str(path),
                   "--speedup", "3600", "--limit", "0", "--namespace", ns, "--apps", "1",
                   "--seed-endpoints", h.base) == 0  # seeds the endpoint, produces nothing
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="endpoint", scope_key=ep, detector="retrodating", mode="enforce",
                 actor="test")
        conn.commit()
    h.start_stages()
    capsys.readouterr()
    start = time.monotonic()
    assert run_cli(monkeypatch, settings, "anomaly", "rehearse", "--file", str(path),
                   "--speedup", "3600", "--tag", "r1", "--progress-s", "0.5") == 0
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert "60 events produced, 60 acknowledged" in err, err
    span_s = (events[-1]["occurred_at"] - events[0]["occurred_at"]) / 1000 / 3600
    assert elapsed >= span_s * 0.95, (elapsed, span_s)  # paced, not dumped
    h.wait_status(ep, "delivered", 55, timeout=120)
    h.wait_status(ep, "held", 5)
    assert h.scalar("SELECT count(*) FROM deliveries WHERE endpoint_id = %s AND"
                    " hold_reason = 'retrodated' AND conversion_id LIKE %s",
                    (ep, "%_r1")) == 5
