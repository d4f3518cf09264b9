"""How the gate persists a scope's state in a Faust table, exactly once in effect.

Faust tables are at-least-once: after a kill -9 the deliveries since the last offset commit
are processed again, and a changelog that already holds their effect would count them
twice. So every persisted state carries ``o``, the source offset of the last delivery
counted in it; a re-processed delivery at or below ``o`` is decided again but not counted
again. That makes the window totals exact across crashes, restarts and rebalances.

A scope's state is two table keys written to the same changelog partition (so a later
write never lands without an earlier one):

- ``hist``: the whole :class:`SeasonalBaseline` (up to 168 x 4 closed totals) and ``o`` --
  written only when the open window moves (about once an hour per scope);
- ``open``: the open window's start and running total and ``o`` -- small, written after
  every batch that touched the scope.

:func:`restore_scope` joins them; when ``open`` belongs to another window than ``hist``
(its write did not land) the history's own total and offset stand. ``extra`` carries
scope-specific fields (the global aggregator's roll-up) in both values.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from postbacks.core.anomaly.baseline import (
    DEFAULT_POLICY,
    BaselinePolicy,
    SeasonalBaseline,
    empty,
    from_dict,
    to_dict,
)
from postbacks.core.anomaly.rollup import PartitionPartial

__all__ = [
    "NOTHING",
    "Tracked",
    "dump_partial",
    "dump_scope",
    "restore_partial",
    "restore_scope",
]

NOTHING = -1  # offset of a state that has counted nothing


@dataclasses.dataclass(frozen=True, slots=True)
class Tracked:
    """A scope's state, the offset of the last delivery counted, and the persisted window."""

    state: SeasonalBaseline
    offset: int = NOTHING
    persisted_start: int | None = None  # open_start of the last ``hist`` written
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


Value = dict[str, Any]  # JSON-able; the table's serializer writes it


def dump_scope(t: Tracked) -> tuple[Value | None, Value, Tracked]:
    """``(hist or None, open, tracked-after)``: ``hist`` only when the window moved."""
    st = t.state
    hist = None
    if st.open_start != t.persisted_start:
        hist = {**to_dict(st), "o": t.offset, "x": t.extra}
        t = dataclasses.replace(t, persisted_start=st.open_start)
    open_ = {"s": st.open_start, "t": st.open_total, "o": t.offset, "x": t.extra}
    return hist, open_, t


def _load(value: object, what: str) -> Value:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: not an object")
    return value


def restore_scope(hist: object | None, open_: object | None,
                  policy: BaselinePolicy = DEFAULT_POLICY) -> Tracked:
    """The state the two persisted values describe (empty when nothing was persisted).

    Raises ValueError on malformed values (the caller dead-letters nothing: it logs and
    starts the scope afresh, which can only under-count, never hold wrongly).
    """
    if hist is None:
        # No history was ever written: only a state that never opened a window persists
        # just ``open`` (the global aggregator's, while its windows are all still open).
        if open_ is not None:
            o = _load(open_, "scope open window")
            o_off, o_extra = o.get("o"), o.get("x") or {}
            if o.get("s") is None and type(o_off) is int and isinstance(o_extra, dict):
                return Tracked(empty(policy), o_off, None, o_extra)
        return Tracked(empty(policy))
    h = _load(hist, "scope history")
    offset = h.get("o")
    extra = h.get("x") or {}
    if type(offset) is not int or not isinstance(extra, dict):
        raise ValueError("scope history: bad offset or extra")
    st = from_dict({k: v for k, v in h.items() if k not in ("o", "x")}, policy)
    if open_ is not None:
        o = _load(open_, "scope open window")
        o_off, o_total, o_extra = o.get("o"), o.get("t"), o.get("x") or {}
        if (o.get("s") == st.open_start and type(o_off) is int and o_off >= offset
                and type(o_total) is int and isinstance(o_extra, dict)):
            st = dataclasses.replace(st, open_total=o_total)
            offset, extra = o_off, o_extra
    return Tracked(st, offset, st.open_start, extra)


def dump_partial(p: PartitionPartial, offset: int) -> Value:
    return {"w": p.window_start, "t": p.total, "c": p.count, "o": offset}


def restore_partial(raw: object | None) -> tuple[PartitionPartial, int]:
    """A partition's partial and the offset of the last delivery counted in it."""
    if raw is None:
        return PartitionPartial(), NOTHING
    v = _load(raw, "partition partial")
    w, total, count, off = v.get("w"), v.get("t"), v.get("c", 0), v.get("o")
    if (not (w is None or type(w) is int) or type(total) is not int or type(off) is not int
            or type(count) is not int):
        raise ValueError("partition partial: bad fields")
    return PartitionPartial(w, total, count), off
