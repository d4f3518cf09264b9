"""How far behind each stage is: lag and backlog age from partition progress; pure.

A stage's progress on a partition is the next offset it has yet to finish (Kafka's committed
offset, or the sink's stored one). Everything from there to the end of the log is its
backlog. The backlog's **age** is the age of its oldest record: it keeps growing while a
stage is stalled or dead (the position does not move), and drops to zero once the stage
has caught up. The age of the *last* record consumed would freeze instead. On the delay
topics a record is meant to wait until its ``due_at``, so its age counts from then: a
record not yet due is no backlog, one past due by ten minutes is ten minutes old.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["PartitionProgress", "backlog_ages", "deleted_unread", "lag_of", "position_of"]


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """One partition of one group's input.

    ``committed``: the group's next offset, or None when it has none (it will read from the
    start of the log). ``start``/``end``: the log's first offset and its end (the last
    stable offset, as a ``read_committed`` consumer sees it; the position itself when
    nothing but transaction markers follows it). ``oldest_ms``: the broker
    timestamp of the first record at the position, when it was read (None: not read, or
    nothing there but transaction markers); ``due_ms``: that record's ``due_at``, on a
    delay topic."""

    group: str
    topic: str
    partition: int
    committed: int | None
    start: int
    end: int
    oldest_ms: int | None = None
    due_ms: int | None = None


def position_of(p: PartitionProgress) -> int:
    """Where the group resumes: its committed offset, or the log's start when it has none
    or when retention has deleted past it."""
    if p.committed is None or p.committed < p.start:
        return p.start
    return p.committed


def lag_of(p: PartitionProgress) -> int:
    """Records between the group's position and the end of the log (never negative)."""
    return max(0, p.end - position_of(p))


def backlog_ages(parts: Iterable[PartitionProgress], now_ms: int,
                 ) -> dict[tuple[str, str], float]:
    """Seconds since the oldest unprocessed record was written -- or fell due, when it
    carries a ``due_at`` -- per (group, topic): the maximum over the topic's partitions;
    0.0 for a topic whose partitions are all caught up (or whose remaining records were not
    read), and for a record not yet due. A clock ahead of the broker's never gives a
    negative age."""
    out: dict[tuple[str, str], float] = {}
    for p in parts:
        key = (p.group, p.topic)
        age = 0.0
        if lag_of(p) > 0 and p.oldest_ms is not None:
            since = max(p.oldest_ms, p.due_ms or 0)
            age = max(0.0, (now_ms - since) / 1000)
        out[key] = max(out.get(key, 0.0), age)
    return out


def deleted_unread(parts: Iterable[PartitionProgress]) -> dict[tuple[str, str], int]:
    """Records retention has deleted past a group's committed offset, per (group, topic):
    the group never read them, and will resume at the log's start. 0 for every topic
    measured without such a gap. Seen here while the stage is down or stuck; the stage
    itself reports the loss only when it is next assigned the partition."""
    out: dict[tuple[str, str], int] = {}
    for p in parts:
        gap = p.start - p.committed if p.committed is not None and p.committed < p.start else 0
        out[(p.group, p.topic)] = out.get((p.group, p.topic), 0) + gap
    return out
