"""Delivery rows the sink holds back until their first outcome (``sink_defer_s``).

A delivery's row waits in memory for its first outcome -- and, when that is ``delivered``,
for the attempt it reports -- (at most ``defer_s``, at most ``defer_max`` rows),
collecting the attempts read meanwhile, and is then written with its
status already projected (:func:`project_row`), so the sink's projection statement finds
nothing to change. Written at once and updated a moment later, each row went through
every index of ``deliveries`` twice (a status change is never a HOT update). A row
released with its delivered outcome and the attempt that outcome reports
(:func:`~sinks.tables.settled`), produced after the sink was given its partition
and with nothing of its delivery read before it, is final: the sink skips the projection
statement for it unless its insert met a stored row.

The sink stores no offset of a ``deliveries.v1`` partition past a waiting row
(:meth:`WaitingRows.stored`), so a crash, a failed flush or a rebalance reads it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sinks.tables import latest_outcome, project_row, settled

__all__ = ["OUTCOME_FIRST_KEPT", "Partition", "WaitingRows"]

Partition = tuple[str, int]
Row = tuple[Any, ...]
OUTCOME_FIRST_KEPT = 100_000


class _Recent:
    """Ids seen lately: two generations, each of fewer than ``OUTCOME_FIRST_KEPT``."""

    def __init__(self) -> None:
        self._new: set[str] = set()
        self._old: set[str] = set()

    def add(self, delivery_id: str) -> bool:
        """Remember ``delivery_id``; True when the oldest generation was forgotten."""
        self._new.add(delivery_id)
        if len(self._new) >= OUTCOME_FIRST_KEPT:
            self._old, self._new = self._new, set()
            return True
        return False

    def __contains__(self, delivery_id: object) -> bool:
        return delivery_id in self._new or delivery_id in self._old

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def clear(self) -> None:
        self._new.clear()
        self._old.clear()


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
        # already; sometimes read before their row: the topics are read side by side) ...
        self._outcome_first = _Recent()
        # ... and of attempts (a row they came before is never written as final)
        self._attempt_first = _Recent()
        self._answered: set[str] = set()  # waiting ids with an outcome since release()
        # Per partition of deliveries.v1, its last stable offset when this sink was given
        # it (or rewound): a row from there on was committed after that, so every record
        # of its delivery has been read by this sink since (records follow a committed
        # row: every stage reads committed; the topics are keyed by endpoint with equal
        # partition counts, and range assignment gives one sink the same partitions of
        # each), and what it folded in, with the ids read before their rows, is all there
        # is. An older row's delivery may have records stored by an earlier run or owner,
        # from a second dispatch of it (the gate deciding again after a crash, a conversion
        # fanned out again) whose attempts are numbered afresh: it is never written as
        # final. No entry: nothing is final.
        self._final_from: dict[Partition, int] = {}
        # Ids forgotten (the sets above are bounded): a row read after one of them could be
        # taken for final, so no row is until the partitions' ends are read again (a row
        # below them was produced before the forgotten records were read).
        self.ends_wanted = False

    def __len__(self) -> int:
        return len(self._rows)

    def remembered(self) -> int:
        """Outcome and attempt ids kept to recognise a row read after them (bounded)."""
        return len(self._outcome_first) + len(self._attempt_first)

    def final_from(self, tp: Partition, offset: int) -> None:
        """Rows of ``tp`` from ``offset`` on may be written final (see ``__init__``)."""
        self._final_from[tp] = offset

    def _forgot(self) -> None:
        self._final_from.clear()
        self.ends_wanted = True

    def read(self, row: Row, tp: Partition, offset: int) -> bool:
        """A delivery row read at ``tp``/``offset``; True when it must be written now (its
        outcome has passed: the projection statement finds it)."""
        self._next[tp] = offset + 1
        if offset in self._at.get(tp, ()):  # already waiting (read twice)
            return False
        delivery_id = row[0]
        if delivery_id in self._outcome_first:
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
            if not self._awaits_attempt(delivery_id, waiting):
                self._answered.add(delivery_id)
            return True
        if self._outcome_first.add(delivery_id):
            self._forgot()
        return False

    def attempt(self, delivery_id: str, row: Row) -> bool:
        """An attempt read; True when its row is waiting (it goes into the row)."""
        waiting = self._rows.get(delivery_id)
        if waiting is None:
            if self._attempt_first.add(delivery_id):
                self._forgot()
            return False
        waiting.attempts.append(row)
        if waiting.outcomes and not self._awaits_attempt(delivery_id, waiting):
            self._answered.add(delivery_id)
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
                        self._final(i, w)))
        return out

    def _awaits_attempt(self, delivery_id: str, w: _Waiting) -> bool:
        """Whether the row's latest outcome is ``delivered`` by an attempt not folded in yet,
        and the row could still be final.

        The agent writes the attempt and its outcome in one transaction, but to two topics
        the sink reads side by side, so the outcome is now and then read a fetch ahead of
        it: the row waits for that attempt too (at most ``defer_s``, as for its first
        outcome) and goes out final, not through the projection statement. Measured
        (bench/delivery.py --parts engine): 12 % of the rows went out without their
        attempt. A row that cannot be final anyway does not wait."""
        o = latest_outcome(w.outcomes)
        return (o[4] == "delivered" and o[5] is not None
                and all(a[5] != o[5] for a in w.attempts) and self._may_be_final(delivery_id, w))

    def _may_be_final(self, delivery_id: str, w: _Waiting) -> bool:
        """Nothing of the delivery read before the row, and the row read from its partition's
        end at assignment on (see ``__init__``)."""
        return (delivery_id not in self._attempt_first
                and all(offset >= self._final_from.get(tp, offset + 1) for tp, offset in w.at))

    def _final(self, delivery_id: str, w: _Waiting) -> bool:
        """Whether the row projected from what it folded in is final (see ``__init__``)."""
        return settled(w.outcomes, w.attempts) and self._may_be_final(delivery_id, w)

    def next_offset(self, tp: Partition) -> int:
        return self._next[tp]

    def stored(self, tp: Partition, offset: int) -> int:
        """The offset to store for ``tp`` instead of ``offset``: never past a waiting row."""
        first = next(iter(self._at.get(tp, {})), None)
        return offset if first is None else min(offset, first)

    def forget(self, tp: Partition) -> None:
        """A revoked partition: its waiting rows go (the new owner reads them again)."""
        self._next.pop(tp, None)
        self._final_from.pop(tp, None)
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
        self._attempt_first.clear()
        self._answered.clear()
        self._final_from.clear()
