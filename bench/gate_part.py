"""Part ``gate`` of ``bench/delivery.py``: the anomaly gate against the delivery engine's
capacity measured in the same round (part ``engine``, which this part needs).

The gate's throughput on a backlog, every detector armed as ``bench/gate.py`` arms them
(:func:`bench.gate.throughput`), then the latency it adds with deliveries offered at half
the engine's capacity just measured (:func:`bench.gate.latency`), through the same gate
process. The figures are ratios to the engine (:func:`bench.targets.gate_vs_engine`), so
the host's speed, which moves both, cancels out.
"""

from __future__ import annotations

from pathlib import Path

from bench import gate
from bench.harness import say
from bench.targets import gate_vs_engine
from postbacks.settings import Settings

__all__ = ["LATENCY_SECONDS", "run_gate_part"]

LATENCY_SECONDS = 10.0


def run_gate_part(base: Settings, engine_per_s: float, n: int,
                  log_dir: Path) -> dict[str, float]:
    """The gate's figures against ``engine_per_s`` (the engine's deliveries/s on record in
    the same round): ``gate_over_engine`` and ``gate_added_p99_ms`` at half of it."""
    if engine_per_s <= 0:
        raise ValueError("the engine's capacity must be measured first (part engine)")
    half = engine_per_s / 2
    say(f"gate part: the engine measured {engine_per_s:,.0f}/s; the gate's throughput on "
        f"{n:,} deliveries, then its added latency at {half:,.0f}/s (half of it)")
    got = gate.run(base, n, half, LATENCY_SECONDS, log_dir)
    figures = gate_vs_engine(engine_per_s, got)
    say(f"gate / engine: {figures['gate_over_engine']:.2f}x "
        f"({figures['gate_throughput_per_s']:,.0f}/s over {engine_per_s:,.0f}/s); "
        f"added p99 at 0.5 x engine capacity {figures['gate_added_p99_ms']:.0f} ms")
    return figures
