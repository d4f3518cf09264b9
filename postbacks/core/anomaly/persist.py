"""How the gate persists state in a Faust table, exactly once in effect.

Faust tables are at-least-once: after a kill -9 the deliveries since the last offset commit
are processed again, and a changelog that already holds their effect would count them
twice. So every persisted state carries ``o``, the source offset of the last delivery
counted in it; a re-processed delivery at or below ``o`` is decided again but not counted
again. That makes the totals exact across crashes, restarts and rebalances. An endpoint's
rolling state is kept by :mod:`.endpoint_state`; a partition's partial for the global
roll-up here.
"""

from __future__ import annotations

from typing import Any

from postbacks.core.anomaly.rollup import PartitionPartial

__all__ = ["NOTHING", "Value", "dump_partial", "restore_partial"]

NOTHING = -1  # offset of a state that has counted nothing


Value = dict[str, Any]  # JSON-able; the table's serializer writes it


def _load(value: object, what: str) -> Value:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: not an object")
    return value


def dump_partial(p: PartitionPartial, offset: int) -> Value:
    return {"w": p.window_start, "t": p.total, "c": p.count, "r": p.retro, "o": offset}


def restore_partial(raw: object | None) -> tuple[PartitionPartial, int]:
    """A partition's partial and the offset of the last delivery counted in it."""
    if raw is None:
        return PartitionPartial(), NOTHING
    v = _load(raw, "partition partial")
    w, total, count, off = v.get("w"), v.get("t"), v.get("c", 0), v.get("o")
    retro = v.get("r", 0)  # written since the retrodated burst; 0 before
    if (not (w is None or type(w) is int) or type(total) is not int or type(off) is not int
            or type(count) is not int or type(retro) is not int):
        raise ValueError("partition partial: bad fields")
    return PartitionPartial(w, total, count, retro), off
