"""A partition's partial sum of payout (and counts) in its current event-time window.

Each gate instance keeps, per partition of ``deliveries.v1`` it owns, the *cumulative*
payout, count and retrodated count of the partition's current window
(:class:`PartitionPartial`; the gate uses one-minute windows) and publishes it, with the
offset of the last delivery counted, to ``anomaly.partials.v1``. The one aggregator
(:mod:`streams.anomaly_gate.aggregate`) keeps each partition's latest partial, sums them
per minute and feeds closed minutes to the global rolling detector and the retrodated
burst (:mod:`postbacks.core.anomaly.retro_burst`).
"""

from __future__ import annotations

from dataclasses import dataclass

from postbacks.core.anomaly.windows import DEFAULT_WINDOW_MS

__all__ = ["PartitionPartial", "accumulate"]


@dataclass(frozen=True, slots=True)
class PartitionPartial:
    """A partition's cumulative payout, payout count and retrodated count in its current
    window (late events count here)."""

    window_start: int | None = None
    total: int = 0
    count: int = 0
    retro: int = 0


def accumulate(p: PartitionPartial, occurred_at_ms: int, payout_micros: int,
               window_ms: int = DEFAULT_WINDOW_MS, retro: bool = False) -> PartitionPartial:
    """Add one payout (``retro``: of a retrodated delivery); an event of a later window
    starts that window's partial."""
    start = occurred_at_ms - occurred_at_ms % window_ms
    if p.window_start is not None and start <= p.window_start:
        return PartitionPartial(p.window_start, p.total + payout_micros, p.count + 1,
                                p.retro + retro)
    return PartitionPartial(start, payout_micros, 1, int(retro))
