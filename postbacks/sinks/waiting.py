"""Delivery rows the sink holds back until their first outcome (``sink_defer_s``).

A delivery's row waits in memory for its first outcome (at most ``defer_s``, at most
``defer_max`` rows), collecting the attempts read meanwhile, and is then written with its
status already projected (:func:`project_row`), so the sink's projection statement finds
nothing to change. Written at once and updated a moment later, each row went through
every index of ``deliveries`` twice (a status change is never a HOT update). A row
released with its delivered outcome and the attempt that outcome reports
(:func:`~postbacks.sinks.tables.settled`) is final: the sink skips the projection
statement for it unless its insert met a stored row.

The sink stores no offset of a ``deliveries.v1`` partition past a waiting row
(:meth:`WaitingRows.stored`), so a crash, a failed flush or a rebalance reads it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from postbacks.sinks.tables import project_row, settled

__all__ = ["OUTCOME_FIRST_KEPT", "Partition", "WaitingRows"]

Partition = tuple[str, int]
Row = tuple[Any, ...]
OUTCOME_FIRST_KEPT = 100_000


@dataclass(slots=True)
class _Waiting:
    row: Row
    read_at: float
    at: list[tuple[Partition, int]]  # where it was read (twice if published twice)
    attempts: list[Row] = field(default_factory=list)
    outcomes: list[Row] = field(default_factory=list)


class WaitingRows:
    def __init__(self, defer_s: float, defer_max: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.defer_s = defer_s
        self.defer_max = defer_max
        self._clock = clock
        self._rows: dict[str, _Waiting] = {}  # delivery id -> row, in reading order
        self._at: dict[Partition, dict[int, str]] = {}  # offset -> id, in reading order
        self._next: dict[Partition, int] = {}  # next offset read of each partition
        # ids of the latest outcomes read with no row waiting for them (mostly rows written
        # already; sometimes read before their row: the topics are read side by side).
        # Two generations, each below OUTCOME_FIRST_KEPT.
        self._outcome_first: set[str] = set()
        self._outcome_first_old: set[str] = set()
        self._answered: set[str] = set()  # waiting ids with an outcome since release()

    def __len__(self) -> int:
        return len(self._rows)

    def remembered(self) -> int:
        """Outcome ids kept to recognise a row read after its outcome (bounded)."""
        return len(self._outcome_first) + len(self._outcome_first_old)

    def read(self, row: Row, tp: Partition, offset: int) -> bool:
        """A delivery row read at ``tp``/``offset``; True when it must be written now (its
        outcome has passed: the projection statement finds it)."""
        self._next[tp] = offset + 1
        if offset in self._at.get(tp, ()):  # already waiting (read twice)
            return False
        delivery_id = row[0]
        if delivery_id in self._outcome_first or delivery_id in self._outcome_first_old:
            return True
        self._at.setdefault(tp, {})[offset] = delivery_id
        waiting = self._rows.get(delivery_id)
        if waiting is None:
            self._rows[delivery_id] = _Waiting(row, self._clock(), [(tp, offset)])
        else:
            waiting.at.append((tp, offset))
        return False

    def passed(self, tp: Partition, offset: int) -> None:
        """A record of the partition that is no row (undecodable): a row released later
        must not store the partition's offset behind it."""
        self._next[tp] = offset + 1

    def outcome(self, delivery_id: str, row: Row) -> bool:
        """An outcome read; True when its row is waiting (it goes into the row)."""
        waiting = self._rows.get(delivery_id)
        if waiting is not None:
            waiting.outcomes.append(row)
            self._answered.add(delivery_id)
            return True
        self._outcome_first.add(delivery_id)
        if len(self._outcome_first) >= OUTCOME_FIRST_KEPT:
            self._outcome_first_old = self._outcome_first
            self._outcome_first = set()
        return False

    def attempt(self, delivery_id: str, row: Row) -> bool:
        """An attempt read; True when its row is waiting (it goes into the row)."""
        waiting = self._rows.get(delivery_id)
        if waiting is None:
            return False
        waiting.attempts.append(row)
        return True

    def due(self) -> bool:
        """Whether a row must go out even with no new record: waiting ``defer_s``, or
        more than ``defer_max`` waiting."""
        oldest = next(iter(self._rows.values()), None)
        return oldest is not None and (len(self._rows) > self.defer_max
                                       or self._clock() - oldest.read_at >= self.defer_s)

    def release(self, everything: bool = False) -> list[tuple[Row, list[Partition], bool]]:
        """The rows to write now, projected, each with the partitions whose next offset it
        frees and whether its projection is final (:func:`settled`): those with an outcome,
        those waiting ``defer_s``, the oldest beyond ``defer_max`` (``everything``: all)."""
        if everything:
            ids = list(self._rows)
        else:  # the oldest first (reading order): due ones, then those with an outcome
            due = self._clock() - self.defer_s
            spill = len(self._rows) - self.defer_max
            ids = []
            for n, (i, w) in enumerate(self._rows.items()):
                if n >= spill and w.read_at > due:
                    break
                ids.append(i)
            ids.extend(i for i in self._answered if i in self._rows)
            ids = list(dict.fromkeys(ids))
        self._answered.clear()
        out = []
        for i in ids:
            w = self._rows.pop(i)
            for tp, offset in w.at:
                del self._at[tp][offset]
            out.append((project_row(w.row, w.outcomes, w.attempts), [tp for tp, _ in w.at],
                        settled(w.outcomes, w.attempts)))
        return out

    def next_offset(self, tp: Partition) -> int:
        return self._next[tp]

    def stored(self, tp: Partition, offset: int) -> int:
        """The offset to store for ``tp`` instead of ``offset``: never past a waiting row."""
        first = next(iter(self._at.get(tp, {})), None)
        return offset if first is None else min(offset, first)

    def forget(self, tp: Partition) -> None:
        """A revoked partition: its waiting rows go (the new owner reads them again)."""
        self._next.pop(tp, None)
        for offset, i in self._at.pop(tp, {}).items():
            w = self._rows.get(i)
            if w is not None:
                w.at.remove((tp, offset))
                if not w.at:
                    del self._rows[i]

    def clear(self) -> None:
        self._rows.clear()
        self._at.clear()
        self._next.clear()
        self._outcome_first.clear()
        self._outcome_first_old.clear()
        self._answered.clear()
