"""Global roll-up: per-partition partial sums of payout per window, and their total.

Each gate instance owns some partitions of ``deliveries.v1`` and keeps, per partition, the
*cumulative* payout of the current window (:class:`PartitionPartial`). It publishes
``(partition, window_start, partial_total)`` to a single-partition topic; one aggregator
folds them into a :class:`Rollup`. Because partials are cumulative, the aggregator keeps
the **last write per (partition, window)** — a re-sent or re-computed partial (after a
restart from the changelog) replaces, never double-counts. The global total of a window
is the sum over partitions. Feed the change of that total into the global
:class:`~postbacks.core.anomaly.baseline.SeasonalBaseline` with ``add``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from postbacks.core.anomaly.windows import DEFAULT_WINDOW_MS

__all__ = [
    "PartitionPartial",
    "Rollup",
    "accumulate",
    "add_partial",
    "global_total",
    "partial",
    "prune",
    "rollup_from_dict",
    "rollup_to_dict",
]


@dataclass(frozen=True, slots=True)
class PartitionPartial:
    """A partition's cumulative payout in its current window (late events count here)."""

    window_start: int | None = None
    total: int = 0


def accumulate(p: PartitionPartial, occurred_at_ms: int, payout_micros: int,
               window_ms: int = DEFAULT_WINDOW_MS) -> PartitionPartial:
    """Add one payout; an event of a later window starts that window's partial."""
    start = occurred_at_ms - occurred_at_ms % window_ms
    if p.window_start is not None and start <= p.window_start:
        return PartitionPartial(p.window_start, p.total + payout_micros)
    return PartitionPartial(start, payout_micros)


@dataclass(frozen=True, slots=True)
class Rollup:
    """Latest cumulative partial per (partition, window_start). Never mutated."""

    partials: dict[tuple[int, int], int] = field(default_factory=dict)


def add_partial(state: Rollup, partition: int, window_start: int,
                partial_total: int) -> Rollup:
    """Record a partition's cumulative partial for a window (last write wins)."""
    partials = dict(state.partials)
    partials[(partition, window_start)] = partial_total
    return Rollup(partials)


def partial(state: Rollup, partition: int, window_start: int) -> int:
    """The partition's latest partial for the window (0 if none)."""
    return state.partials.get((partition, window_start), 0)


def global_total(state: Rollup, window_start: int) -> int:
    """Sum of every partition's latest partial for the window."""
    return sum(v for (_, w), v in state.partials.items() if w == window_start)


def prune(state: Rollup, before_window_start: int) -> Rollup:
    """Forget windows that start before ``before_window_start`` (bounded state)."""
    return Rollup({k: v for k, v in state.partials.items() if k[1] >= before_window_start})


def rollup_to_dict(state: Rollup) -> dict[str, int | str]:
    """Compact form for a table changelog: ``partition:window:total`` joined by ``;``."""
    items = sorted(state.partials.items())
    return {"v": 1, "partials": ";".join(f"{p}:{w}:{t}" for (p, w), t in items)}


def rollup_from_dict(data: dict[str, int | str]) -> Rollup:
    """Inverse of :func:`rollup_to_dict`; raises ValueError on anything malformed."""
    raw = data.get("partials")
    if data.get("v") != 1 or not isinstance(raw, str):
        raise ValueError("rollup state: unknown format")
    partials: dict[tuple[int, int], int] = {}
    for item in filter(None, raw.split(";")):
        try:
            p, w, t = (int(x) for x in item.split(":"))
        except ValueError:
            raise ValueError(f"rollup state: bad item {item!r}") from None
        partials[(p, w)] = t
    return Rollup(partials)
