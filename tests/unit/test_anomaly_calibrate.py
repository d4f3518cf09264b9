"""Calibration replay: detect-mode signals, the enforce simulation, the CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from postbacks.core.anomaly.detectors import RateThresholds
from postbacks.core.anomaly.modes import GateModes
from postbacks.core.anomaly.windows import DAY_MS
from postbacks.records import ConversionEvent, DeliveryRecord
from streams.anomaly_gate import calibrate
from streams.anomaly_gate.calibrate import ReplayConfig, format_report, replay
from streams.anomaly_gate.history import (
    START_MS,
    Concentrated,
    HistoryConfig,
    generate,
    write_jsonl,
)
from tests.unit.factories import make_conversion, make_delivery

T = START_MS + 10 * 3_600_000
DAY = "2026-03-02"


def _conv(i: int, **over: object) -> ConversionEvent:
    base: dict[str, object] = dict(
        event_id=f"evt_{i}", conversion_id=f"cv_{i}", app_id="app_x_0001",
        occurred_at=T + i, source_created_at=T + i, source_completed_at=T + i - 60_000,
        payout_usd_micros=1_000_000)
    base.update(over)
    return make_conversion(**base)


def test_detect_replay_counts_signals_by_day_and_reason() -> None:
    events = [_conv(0), _conv(1, source_completed_at=T - 30 * DAY_MS),
              _conv(2, source_created_at=None), _conv(3, payout_usd_micros=None)]
    rep = replay(events)
    assert rep.events == 4 and rep.payout_micros == 3_000_000
    assert rep.signals == {(DAY, "missing_anomaly_inputs"): (2, 1_000_000),
                           (DAY, "retrodated"): (1, 1_000_000)}
    assert rep.would_hold == rep.signals  # the enforce simulation holds exactly those
    assert rep.trips == () and rep.first_hold_ms == T + 1
    assert rep.cohorts[("normal", True, "retrodated")] == (1, 1_000_000)
    assert rep.by_day == {DAY: (4, 3_000_000)}
    assert "retrodated" in format_report(rep)


def test_off_modes_never_signal() -> None:
    events = [_conv(1, source_completed_at=T - 30 * DAY_MS), _conv(3, payout_usd_micros=None)]
    rep = replay(events, ReplayConfig(modes=GateModes()))
    assert rep.signals == {} and rep.would_hold == {} and rep.first_hold_ms is None


def test_delivery_records_bring_their_endpoint() -> None:
    dlv: DeliveryRecord = make_delivery(endpoint_id="ep_mine",
                                        conversion=_conv(1, payout_usd_micros=900_000_000))
    cfg = ReplayConfig(endpoint_thresholds=RateThresholds(3.0, 100))
    rep = replay([dlv], cfg)
    assert rep.events == 1 and rep.payout_micros == 900_000_000


def test_concentrated_cohort_trips_its_endpoint_in_detect_replay() -> None:
    cfg = HistoryConfig(weeks=3, apps=20, mean_rate_per_s=0.05,
                        cohorts=(Concentrated(start_hour=3 * 168 + 12, hours=3, factor=30,
                                              rank=1),))
    events = generate(cfg, random.Random(3))
    rep = replay(events, ReplayConfig(endpoint_thresholds=RateThresholds(3.0, 1_000_000_000),
                                      global_thresholds=RateThresholds(1.25, 10**15)))
    assert [(t.trip.scope, t.trip.key) for t in rep.trips] == [("endpoint", "ep_cal_0001_1")]
    trip_at = rep.trips[0].at_ms
    cohort_at = START_MS + (3 * 168 + 12) * 3_600_000
    assert cohort_at <= trip_at < cohort_at + 3_600_000
    assert rep.first_hold_ms == trip_at  # nothing held before: no false positive
    assert all(day >= "2026-03-23" for day, _ in rep.would_hold)
    assert ("2026-03-23", "payout_rate_endpoint") in rep.signals


def test_progress_is_reported() -> None:
    seen: list[int] = []
    replay((_conv(i) for i in range(10)), ReplayConfig(progress_every=4),
           lambda n, ts: seen.append(n))
    assert seen == [4, 8]


def test_cli_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        calibrate.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--generate" in out and "--file" in out and "--json" in out


def test_cli_generate_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    assert calibrate.main(["--generate", "--weeks", "1", "--rate", "0.01", "--seed", "2",
                           "--inject", "retrodated", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "retrodated" in text and "events/s" in text
    doc = json.loads(out.read_text())
    assert doc["events"] > 0 and any(s["reason"] == "retrodated" for s in doc["signals"])
    hist = tmp_path / "h.jsonl"
    write_jsonl(generate(HistoryConfig(weeks=1, mean_rate_per_s=0.01), random.Random(2)), hist)
    assert calibrate.main(["--file", str(hist), "--quiet", "--mode", "enforce"]) == 0
    assert "modes: retrodating=enforce" in capsys.readouterr().out


def test_cli_rejects_bad_settings() -> None:
    with pytest.raises(SystemExit) as e:
        calibrate.main(["--generate", "--window-minutes", "7"])
    assert e.value.code == 2
