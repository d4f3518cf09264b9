"""Synthetic history: deterministic, lazy, seasonal, with marked anomaly cohorts."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import pytest

from postbacks.core.anomaly.detectors import retrodated
from postbacks.core.anomaly.windows import DAY_MS, HOUR_MS, day_of_week, hour_of_day
from postbacks.records import ConversionEvent
from postbacks.tools.seed import app_id_for
from streams.anomaly_gate import history
from streams.anomaly_gate.history import (
    COHORT_KEY,
    START_MS,
    BroadShallow,
    Concentrated,
    HistoryConfig,
    Retrodated,
    cohort_named,
    endpoint_for_app,
    generate,
    read_jsonl,
    seasonality,
    write_jsonl,
)

SMALL = HistoryConfig(weeks=1, apps=30, mean_rate_per_s=0.05)


def _events(cfg: HistoryConfig = SMALL, seed: int = 1) -> list[ConversionEvent]:
    return list(generate(cfg, random.Random(seed)))


def test_deterministic_per_seed() -> None:
    a, b, c = _events(seed=7), _events(seed=7), _events(seed=8)
    assert a == b and a != c


def test_lazy_and_ordered_by_event_time() -> None:
    it = generate(HistoryConfig(weeks=520), random.Random(1))  # ten years: never built whole
    first = list(itertools.islice(it, 5_000))
    times = [e["occurred_at"] for e in first]
    assert times == sorted(times) and times[0] >= START_MS


def test_records_look_like_conversions() -> None:
    evs = _events()
    assert set(evs[0]) == set(ConversionEvent.__annotations__)
    assert {e["app_id"] for e in evs} <= {app_id_for("cal", i) for i in range(1, 31)}
    assert len({e["event_id"] for e in evs}) == len(evs)
    assert all(e["payout_usd_micros"] and e["payout_usd_micros"] > 0 for e in evs)
    assert endpoint_for_app("app_cal_0007") == "ep_cal_0007_1"


def test_rate_and_seasonality() -> None:
    evs = _events(HistoryConfig(weeks=2, apps=30, mean_rate_per_s=0.1))
    assert len(evs) == pytest.approx(0.1 * 2 * 7 * 86_400, rel=0.03)
    by_hour = Counter(hour_of_day(e["occurred_at"]) for e in evs)
    assert by_hour[15] > 3 * by_hour[3]  # diurnal: peak 15:00, trough 03:00
    by_dow = Counter(day_of_week(e["occurred_at"]) for e in evs)
    assert min(by_dow[d] for d in range(5)) > max(by_dow[5], by_dow[6])  # quieter weekends
    week = [seasonality(START_MS + h * HOUR_MS) for h in range(168)]
    assert sum(week) / 168 == pytest.approx(1.0)


def test_normal_traffic_is_never_retrodated() -> None:
    evs = _events()
    assert not any(retrodated(e["source_created_at"], e["source_completed_at"]) for e in evs)
    assert not any(COHORT_KEY in e["source_snapshot"] for e in evs)


def _cohort(evs: list[ConversionEvent], name: str) -> list[ConversionEvent]:
    return [e for e in evs if e["source_snapshot"].get(COHORT_KEY) == name]


def test_broad_shallow_cohort() -> None:
    cfg = HistoryConfig(weeks=0, apps=120, mean_rate_per_s=0.5,
                        cohorts=(BroadShallow(start_hour=9, hours=24),))
    evs = _events(cfg)
    cohort = _cohort(evs, "broad_shallow")
    start = START_MS + 9 * HOUR_MS
    assert all(start <= e["occurred_at"] < start + DAY_MS for e in cohort)
    assert len({e["app_id"] for e in cohort}) == 40
    retro = sum(retrodated(e["source_created_at"], e["source_completed_at"]) is True
                for e in cohort)
    assert retro / len(cohort) == pytest.approx(0.29, abs=0.03)
    # each endpoint +40-60% of its normal volume in those hours (+-noise)
    normal = Counter(e["app_id"] for e in evs if start <= e["occurred_at"] < start + DAY_MS
                     and COHORT_KEY not in e["source_snapshot"])
    extra = Counter(e["app_id"] for e in cohort)
    big = [a for a, n in normal.most_common(10)]
    assert all(0.25 < extra[a] / normal[a] < 0.8 for a in big if a in extra)


def test_concentrated_and_retrodated_cohorts() -> None:
    cfg = HistoryConfig(weeks=1, apps=30, mean_rate_per_s=0.2,
                        cohorts=(Concentrated(start_hour=100, hours=3),
                                 Retrodated(start_hour=120, hours=2, per_hour=50)))
    evs = _events(cfg)
    conc = _cohort(evs, "concentrated")
    assert {e["app_id"] for e in conc} == {app_id_for("cal", 3)}
    window = [e for e in evs if e["app_id"] == app_id_for("cal", 3)
              and START_MS + 100 * HOUR_MS <= e["occurred_at"] < START_MS + 103 * HOUR_MS]
    assert len(window) == pytest.approx(10 * (len(window) - len(conc)), rel=0.35)
    retro = _cohort(evs, "retrodated")
    assert len(retro) == pytest.approx(100, rel=0.35)
    assert all(retrodated(e["source_created_at"], e["source_completed_at"]) is True
               for e in retro)


def test_history_extends_to_cover_cohorts() -> None:
    assert HistoryConfig(weeks=1).hours == 168
    assert HistoryConfig(weeks=1, cohorts=(BroadShallow(start_hour=170, hours=24),)).hours == 194


@pytest.mark.parametrize("name", ["retrodated", "concentrated", "broad_shallow"])
def test_cohort_named(name: str) -> None:
    assert cohort_named(name, 5).name == name


def test_cohort_named_unknown() -> None:
    with pytest.raises(ValueError, match="unknown cohort"):
        cohort_named("nope", 5)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    evs = _events()
    path = tmp_path / "h.jsonl"
    assert write_jsonl(evs, path) == len(evs)
    assert list(read_jsonl(path)) == evs


def test_cli_writes_a_file(tmp_path: Path) -> None:
    out = tmp_path / "h.jsonl"
    assert history.main(["--out", str(out), "--weeks", "1", "--rate", "0.01",
                         "--inject", "retrodated"]) == 0
    evs = list(read_jsonl(out))
    assert evs and _cohort(evs, "retrodated")
