"""The gate's table writes, held back until every record produced before them is
acknowledged.

A scope's state on the changelog says "counted up to offset o". When the partial that
carries that count to the global aggregator is not on the broker yet, a crash between the
two acknowledgements leaves a state restored as counted whose money never reaches the
aggregator: the restarted gate skips those deliveries as already counted and the global
window is short by them for good (seen in ``test_window_state_exact_after_kill9_of_the_gate``,
a kill -9 between the acknowledgements; $694 of $21,200 missing). So a flush takes the
state at once, waits for what was produced before it, and only then produces the state.

Flushes overlap (the commit timer, a trip's own flush, a rebalance), so what is held is
released in the order it was taken: an older state is never produced after a newer one
for the same key.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

__all__ = ["HeldWrites", "Write"]


class Write(NamedTuple):
    table: Any  # a Faust table (its changelog topic is where the record goes)
    partition: int
    key: str
    value: Any


class HeldWrites:
    def __init__(self) -> None:
        self._seq = 0
        self._held: deque[tuple[int, Write]] = deque()

    def hold(self, writes: list[Write]) -> int:
        """Hold ``writes`` (one state, taken at once); returns its ticket for release."""
        self._seq += 1
        self._held.extend((self._seq, w) for w in writes)
        return self._seq

    def release(self, upto: int | None = None) -> list[Write]:
        """The held writes with a ticket up to ``upto`` (all when None), oldest first."""
        out: list[Write] = []
        while self._held and (upto is None or self._held[0][0] <= upto):
            out.append(self._held.popleft()[1])
        return out

    def __len__(self) -> int:
        return len(self._held)
