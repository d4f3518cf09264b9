"""The delivery benchmark's table against its targets (bench/targets.py): each target met
or not met by the figure measured, not run without it, and the table's rows."""

from __future__ import annotations

import pytest

from bench.targets import MET, NOT_MET, NOT_RUN, TARGETS, Target, judge, rows, table


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
                   "isolation_ratio": (1.2, False), "isolation_ratio_max": (1.5, False)}


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
    assert text.splitlines()[-1] == "targets met: 4 of 6 (0 not run)"
    engine = next(line for line in text.splitlines() if line.startswith("engine:"))
    assert engine.split()[-2:] == ["not", "met"] and "0.70x" in engine
    # the columns line up: every row's verdict starts where the header's does
    lines = text.splitlines()
    col = lines[0].index("verdict")
    assert all(line[col:].strip() in (MET, NOT_MET, NOT_RUN) for line in lines[2:8])
