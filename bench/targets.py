"""The delivery benchmark's figures against the targets (docs/performance.md): one table of
what one run measured, each target met or not met. Pure: no services, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MET", "NOT_MET", "NOT_RUN", "STAGES", "TARGETS", "Row", "Target", "gate_vs_engine",
           "judge", "rows", "table"]

MET = "met"
NOT_MET = "not met"
NOT_RUN = "not run"


@dataclass(frozen=True)
class Target:
    """A figure (a key of the results) and the bound it must keep: ``at_least`` or at
    most ``limit``."""

    key: str
    label: str
    limit: float
    at_least: bool
    unit: str = "x"

    def says(self) -> str:
        return f"{'>=' if self.at_least else '<='} {_num(self.limit, self.unit)}"


TARGETS: tuple[Target, ...] = (
    Target("agent_over_bare", "the agent alone / the bare client", 1.0, True),
    Target("engine_over_bare", "engine: backlog -> POST -> PostgreSQL / bare", 0.85, True),
    Target("pipeline_over_bare",
           "whole pipeline: conversion -> fan-out -> gate -> agent -> sink / bare", 0.6, True),
    Target("pipeline_latency_p99_ms",
           "p99 conversion -> first POST at a quarter of pipeline capacity", 250, False, "ms"),
    Target("isolation_ratio", "healthy p99 with / without a 15-s endpoint, median pair",
           1.2, False),
    Target("isolation_ratio_max", "healthy p99 with / without a 15-s endpoint, worst pair",
           1.5, False),
    Target("gate_over_engine", "gate throughput / engine capacity (same round)", 2.0, True),
    Target("gate_added_p99_ms", "gate added p99 at 0.5 x engine capacity", 50, False, "ms"),
)

# Figures printed beside the targets, without one: (key, label, unit)
_PLAIN: tuple[tuple[str, str, str], ...] = (
    ("bare_client_per_s", "bare aiohttp client, POSTs/s", "/s"),
    ("agent_per_s", "the agent alone, deliveries/s", "/s"),
    ("engine_end_to_end_per_s", "engine, deliveries/s on record", "/s"),
    ("end_to_end_per_s", "whole pipeline, deliveries/s", "/s"),
    ("pipeline_latency_rate", "latency part: conversions/s offered", "/s"),
    ("pipeline_latency_p50_ms", "latency part: p50 conversion -> first POST", "ms"),
    ("healthy_p99_ms_without_slow", "healthy p99 without the 15-s endpoint (median)", "ms"),
    ("healthy_p99_ms_with_slow", "healthy p99 with the 15-s endpoint (median)", "ms"),
    ("isolation_pairs", "isolation pairs run", ""),
    ("agents_one_per_s", "one agent on the dispatch partitions, deliveries/s", "/s"),
    ("agents_two_per_s", "two agents on the same partitions, deliveries/s", "/s"),
    ("two_agents_over_one", "two agents / one agent", "x"),
    ("gate_throughput_per_s", "gate alone on a backlog, deliveries/s", "/s"),
    ("gate_cpu_us_per_delivery", "gate alone: CPU per delivery on the backlog", "us"),
    ("gate_latency_rate", "gate latency part: deliveries/s offered", "/s"),
    ("gate_added_p50_ms", "gate added p50 at 0.5 x engine capacity", "ms"),
    ("gate_steady_p99_ms", "gate added p99 after the latency part's first second", "ms"),
    ("gate_first_second_p99_ms", "gate added p99 in the latency part's first second", "ms"),
)

# The stages whose CPU per delivery the table shows (``cpu_us_<stage>``), and the rest
# of the machine's share of the whole pipeline
STAGES: tuple[str, ...] = ("fanout", "gate", "agent", "sink", "relay")
_OTHERS: tuple[str, ...] = ("kafka", "postgres", "receiver")


def gate_vs_engine(engine_per_s: float, gate: dict[str, Any]) -> dict[str, float]:
    """The gate's figures (``bench.gate.run``: its throughput on a backlog, then the latency
    it added with deliveries offered at half the engine's capacity) read against the
    engine's capacity measured in the same round. ``gate_added_p99_ms`` is over every
    delivery of the latency part, its first second included."""
    out = {"gate_throughput_per_s": float(gate["throughput_per_s"]),
           "gate_over_engine": gate["throughput_per_s"] / engine_per_s,
           "gate_cpu_us_per_delivery": float(gate["cpu_us_per_delivery"])}
    if "latency_p99_ms" in gate:
        out |= {"gate_latency_rate": float(gate["latency_rate"]),
                "gate_latency_over_engine": gate["latency_rate"] / engine_per_s,
                "gate_added_p50_ms": float(gate["latency_p50_ms"]),
                "gate_added_p99_ms": float(gate["latency_p99_ms"]),
                "gate_steady_p99_ms": float(gate["steady_p99_ms"]),
                "gate_first_second_p99_ms": float(gate["first_second_p99_ms"])}
    return out


@dataclass(frozen=True)
class Row:
    label: str
    measured: str
    target: str
    verdict: str


def _num(value: float, unit: str) -> str:
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "ms":
        return f"{value:.0f} ms"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "us":
        return f"{value:,.0f} µs"
    return f"{value:g}"


def judge(target: Target, results: dict[str, float]) -> str:
    """MET or NOT_MET by the figure in ``results``; NOT_RUN without it."""
    value = results.get(target.key)
    if value is None or value != value:  # absent or NaN
        return NOT_RUN
    ok = value >= target.limit if target.at_least else value <= target.limit
    return MET if ok else NOT_MET


def rows(results: dict[str, float]) -> list[Row]:
    """The targets first (each judged), then the plain figures and the CPU per delivery by
    stage that were measured."""
    out = []
    for t in TARGETS:
        value = results.get(t.key)
        shown = "-" if value is None else _num(value, t.unit)
        out.append(Row(t.label, shown, t.says(), judge(t, results)))
    for key, label, unit in _PLAIN:
        if key in results:
            out.append(Row(label, _num(results[key], unit), "", ""))
    for stage in (*STAGES, *_OTHERS):
        key = f"cpu_us_{stage}"
        if key in results:
            where = " (relay part)" if stage == "relay" else " (whole pipeline)"
            out.append(Row(f"CPU per delivery: {stage}{where}", _num(results[key], "us"),
                           "", ""))
    return out


def table(results: dict[str, float]) -> str:
    """The rows as a fixed-width text table, with a count of the targets met."""
    got = rows(results)
    head = Row("figure", "measured", "target", "verdict")
    widths = [max(len(getattr(r, f)) for r in (head, *got))
              for f in ("label", "measured", "target", "verdict")]
    lines = []
    for r in (head, *got):
        cells = (r.label, r.measured, r.target, r.verdict)
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        if r is head:
            lines.append("  ".join("-" * w for w in widths))
    verdicts = [judge(t, results) for t in TARGETS]
    lines.append(f"targets met: {verdicts.count(MET)} of {len(TARGETS)}"
                 f" ({verdicts.count(NOT_RUN)} not run)")
    return "\n".join(lines)
