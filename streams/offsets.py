"""Out-of-order completion with exactly-once outputs.

Deliveries of one partition finish in any order (one slow endpoint must not hold up the
others). Each consumed record gets a :class:`Slot`; a finished record fills it with its
outputs. :meth:`Tracker.drain` hands back the outputs of *every* finished record and, per
partition, what to commit with them in the same transaction: the lowest unfinished offset
(the committed offset) plus, in the commit's metadata, a bitmap of the records above it
that are already finished (the technique of Confluent's Parallel Consumer). After a crash
or rebalance, :func:`decode_done` of the committed metadata tells the new owner which
records above the committed offset to skip, so no input's outputs are produced twice and
none is lost. The bitmap spans at most ``max_span`` offsets (it must fit Kafka's default
4 KiB offset metadata); finished records beyond it wait to be drained.
"""

from __future__ import annotations

import base64
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Commit", "Slot", "Tracker", "decode_done", "encode_done"]

Item = tuple[str, bytes | None, bytes]  # (topic base, key, value)
Commit = tuple[int, str]  # (next offset to read, metadata)

_PREFIX = "pc1:"


def encode_done(base: int, done: list[int]) -> str:
    """Metadata naming the finished offsets above ``base`` (the committed offset)."""
    if not done:
        return ""
    width = max(done) - base + 1
    bits = bytearray((width + 7) // 8)
    for off in done:
        i = off - base
        bits[i >> 3] |= 1 << (i & 7)
    return _PREFIX + base64.b64encode(zlib.compress(bytes(bits))).decode()


def decode_done(base: int, metadata: str | None) -> set[int]:
    """Offsets above ``base`` already finished, from committed metadata (unknown -> none)."""
    if not metadata or not metadata.startswith(_PREFIX):
        return set()
    try:
        bits = zlib.decompress(base64.b64decode(metadata[len(_PREFIX):]))
    except (ValueError, zlib.error):
        return set()
    return {base + (i << 3) + b for i, byte in enumerate(bits) for b in range(8)
            if byte >> b & 1}


@dataclass(slots=True)
class _Count:
    open: int = 0
    finished: int = 0  # finishes so far: each slot's place in finishing order


@dataclass(slots=True, eq=False)
class Slot:
    offset: int
    _count: _Count
    outputs: list[Item] | None = None  # None while unfinished
    drained: bool = False
    seq: int = 0  # its place in finishing order
    detached: bool = False  # its partition was revoked (or the batch aborted) meanwhile

    def finish(self, outputs: list[Item]) -> None:
        if self.outputs is None and not self.drained:
            self._count.open -= 1
        self._count.finished += 1
        self.seq = self._count.finished
        self.outputs = outputs


@dataclass(slots=True)
class _Partition:
    slots: deque[Slot] = field(default_factory=deque)
    dirty: bool = False


@dataclass(slots=True)
class Tracker:
    max_span: int = 20_000
    _parts: dict[tuple[str, int], _Partition] = field(default_factory=dict)
    _count: _Count = field(default_factory=_Count)

    def track(self, topic: str, partition: int, offset: int) -> Slot:
        slot = Slot(offset, self._count)
        self._count.open += 1
        self._parts.setdefault((topic, partition), _Partition()).slots.append(slot)
        return slot

    def drain(self, unread: Mapping[tuple[str, int], set[int]] | None = None,
              ) -> tuple[list[Item], dict[tuple[str, int], Commit]]:
        """Outputs of every newly finished record, and the commit that covers them.

        ``unread``: per partition, the offsets a previous owner finished that this one has
        not read again yet (what :func:`decode_done` gave at the assignment, less what was
        read since). They stay in the commit's metadata: the tracker knows only what it
        has read, and without them the first commit after an assignment dropped the
        rest, so the owner after the next rebalance sent them again."""
        done: list[tuple[int, list[Item]]] = []
        commits: dict[tuple[str, int], Commit] = {}
        for key, part in self._parts.items():
            slots = part.slots
            if not slots:
                continue
            limit = slots[0].offset + self.max_span
            for slot in slots:
                if slot.offset >= limit:
                    break
                if not slot.drained and slot.outputs is not None:
                    if slot.outputs:
                        done.append((slot.seq, slot.outputs))
                    slot.outputs = None
                    slot.drained = True
                    part.dirty = True
            last = slots[-1].offset
            while slots and slots[0].drained:
                slots.popleft()
            if not part.dirty:
                continue
            part.dirty = False
            base = slots[0].offset if slots else last + 1
            finished = [s.offset for s in slots if s.drained]
            rest = unread.get(key) if unread else None
            if rest:
                finished.extend(o for o in rest if o >= base)
            commits[key] = (base, encode_done(base, finished))
        # in the order they finished: a strict endpoint's parked followers come after the
        # head they wait behind even when they were consumed before it (streams/strict.py)
        done.sort(key=lambda x: x[0])
        items = [item for _, outputs in done for item in outputs]
        return items, commits

    def forget(self, topic: str, partition: int) -> None:
        """Partition revoked: drop its slots (their work will be redone by the new owner)."""
        part = self._parts.pop((topic, partition), None)
        if part is not None:
            self._detach(part.slots)

    def clear(self) -> None:
        for part in self._parts.values():
            self._detach(part.slots)
        self._parts.clear()

    def _detach(self, slots: deque[Slot]) -> None:
        orphan = _Count()
        for s in slots:
            if s.outputs is None and not s.drained:
                self._count.open -= 1
                orphan.open += 1
                s._count = orphan  # a late finish no longer counts here
                s.detached = True

    def unfinished(self) -> int:
        return self._count.open

    def pending(self) -> int:
        return sum(len(p.slots) for p in self._parts.values())
