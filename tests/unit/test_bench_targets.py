"""The delivery benchmark's table against its targets (bench/targets.py): each target met
or not met by the figure measured, not run without it, and the table's rows."""

from __future__ import annotations

import pytest

from bench.targets import MET, NOT_MET, NOT_RUN, TARGETS, Target, gate_vs_engine, judge, rows, table


def _target(key: str) -> Target:
    return next(t for t in TARGETS if t.key == key)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("agent_over_bare", 1.0, MET),  # at least 1.0x: the bound itself is met
    ("agent_over_bare", 0.99, NOT_MET),
    ("engine_over_bare", 0.86, MET),
    ("engine_over_bare", 0.84, NOT_MET),
    ("pipeline_over_bare", 0.37, NOT_MET),
    ("pipeline_over_bare", 0.61, MET),
    ("pipeline_latency_p99_ms", 250.0, MET),  # at most 250 ms
    ("pipeline_latency_p99_ms", 251.0, NOT_MET),
    ("isolation_ratio", 1.19, MET),
    ("isolation_ratio", 1.21, NOT_MET),
    ("isolation_ratio_max", 1.5, MET),
    ("isolation_ratio_max", 1.6, NOT_MET),
    ("gate_over_engine", 2.0, MET),  # at least 2x the engine's capacity
    ("gate_over_engine", 1.99, NOT_MET),
    ("gate_added_p99_ms", 50.0, MET),  # at most 50 ms
    ("gate_added_p99_ms", 51.0, NOT_MET),
])
def test_each_target_is_judged_by_its_bound(key: str, value: float, expected: str) -> None:
    assert judge(_target(key), {key: value}) == expected


def test_a_figure_not_measured_is_not_run_not_failed() -> None:
    assert judge(_target("engine_over_bare"), {}) == NOT_RUN
    assert judge(_target("engine_over_bare"), {"engine_over_bare": float("nan")}) == NOT_RUN


def test_the_targets_are_the_issues_ratios() -> None:
    got = {t.key: (t.limit, t.at_least) for t in TARGETS}
    assert got == {"agent_over_bare": (1.0, True), "engine_over_bare": (0.85, True),
                   "pipeline_over_bare": (0.6, True),
                   "pipeline_latency_p99_ms": (250, False),
                   "isolation_ratio": (1.2, False), "isolation_ratio_max": (1.5, False),
                   "gate_over_engine": (2.0, True), "gate_added_p99_ms": (50, False)}


def test_rows_show_targets_first_then_the_figures_and_cpu_measured() -> None:
    results = {"bare_client_per_s": 4_000.0, "agent_over_bare": 1.1,
               "two_agents_over_one": 0.8, "cpu_us_gate": 410.4, "cpu_us_kafka": 90.0}
    got = rows(results)
    assert [r.verdict for r in got[:len(TARGETS)]] == [MET] + [NOT_RUN] * (len(TARGETS) - 1)
    assert got[0].measured == "1.10x" and got[0].target == ">= 1.00x"
    rest = {r.label: r.measured for r in got[len(TARGETS):]}
    assert rest == {"bare aiohttp client, POSTs/s": "4,000/s",
                    "two agents / one agent": "0.80x",
                    "CPU per delivery: gate (whole pipeline)": "410 µs",
                    "CPU per delivery: kafka (whole pipeline)": "90 µs"}


def test_the_table_counts_the_targets_met() -> None:
    results = {"agent_over_bare": 1.05, "engine_over_bare": 0.7, "pipeline_over_bare": 0.65,
               "pipeline_latency_p99_ms": 120.0, "isolation_ratio": 1.1,
               "isolation_ratio_max": 2.0}
    text = table(results)
    assert text.splitlines()[-1] == "targets met: 4 of 8 (2 not run)"
    engine = next(line for line in text.splitlines() if line.startswith("engine:"))
    assert engine.split()[-2:] == ["not", "met"] and "0.70x" in engine
    # the columns line up: every row's verdict starts where the header's does
    lines = text.splitlines()
    col = lines[0].index("verdict")
    assert all(line[col:].strip() in (MET, NOT_MET, NOT_RUN) for line in lines[2:8])


def _gate(**kw: float) -> dict[str, float]:
    return {"throughput_per_s": 9_000, "cpu_us_per_delivery": 110, "latency_rate": 1_500.0,
            "latency_p50_ms": 14.0, "latency_p99_ms": 61.0, "steady_p99_ms": 30.0,
            "first_second_p99_ms": 420.0} | kw


def test_the_gate_is_read_against_the_engine_of_the_same_round() -> None:
    got = gate_vs_engine(3_000.0, _gate())
    assert got["gate_over_engine"] == 3.0 and got["gate_latency_over_engine"] == 0.5
    # the p99 judged is over every delivery of the latency part, its first second included
    assert got["gate_added_p99_ms"] == 61.0 and got["gate_steady_p99_ms"] == 30.0
    assert judge(_target("gate_over_engine"), got) == MET
    assert judge(_target("gate_added_p99_ms"), got) == NOT_MET
    assert judge(_target("gate_over_engine"), gate_vs_engine(6_000.0, _gate())) == NOT_MET


def test_a_gate_run_without_its_latency_part_leaves_that_target_not_run() -> None:
    only = {k: v for k, v in _gate().items() if not k.startswith(("latency", "steady", "first"))}
    got = gate_vs_engine(3_000.0, only)
    assert "gate_added_p99_ms" not in got
    assert judge(_target("gate_added_p99_ms"), got) == NOT_RUN
    assert judge(_target("gate_over_engine"), got) == MET
