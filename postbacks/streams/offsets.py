"""Out-of-order completion, in-order commits.

Deliveries of one partition finish in any order (one slow endpoint must not hold up the
others' HTTP sends), but a partition's committed offset may only move past records that
are finished. Each consumed record gets a :class:`Slot`; a finished record fills its slot
with its outputs. :meth:`Tracker.drain` returns, per partition, the outputs of the
contiguous finished prefix and the offset just past it (the lowest unfinished offset), so
the caller produces exactly those outputs and commits exactly that offset in one
transaction: an input's outputs and its offset commit always land together.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["Slot", "Tracker"]

Item = tuple[str, bytes | None, bytes]  # (topic base, key, value)


@dataclass(slots=True, eq=False)
class Slot:
    offset: int
    outputs: list[Item] | None = None  # None while unfinished

    def finish(self, outputs: list[Item]) -> None:
        self.outputs = outputs


@dataclass(slots=True)
class Tracker:
    _parts: dict[tuple[str, int], deque[Slot]] = field(default_factory=dict)

    def track(self, topic: str, partition: int, offset: int) -> Slot:
        slot = Slot(offset)
        self._parts.setdefault((topic, partition), deque()).append(slot)
        return slot

    def drain(self) -> tuple[list[Item], dict[tuple[str, int], int]]:
        """Outputs ready to produce, and the offsets to commit with them."""
        items: list[Item] = []
        offsets: dict[tuple[str, int], int] = {}
        for key, slots in self._parts.items():
            while slots and slots[0].outputs is not None:
                slot = slots.popleft()
                items.extend(slot.outputs or ())
                offsets[key] = slot.offset + 1
        return items, offsets

    def forget(self, topic: str, partition: int) -> None:
        """Partition revoked: drop its slots (their work will be redone by the new owner)."""
        self._parts.pop((topic, partition), None)

    def unfinished(self) -> int:
        return sum(1 for slots in self._parts.values() for s in slots if s.outputs is None)

    def pending(self) -> int:
        return sum(len(slots) for slots in self._parts.values())
