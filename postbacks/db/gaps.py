"""The gap detector (seed 000 §9): deliveries that have gone quiet.

A delivery whose status is ``pending`` (no outcome at all), ``released`` or ``replayed``
(re-driven, and nothing heard since) for longer than the gap window is a **gap**: the
pipeline accepted it and nothing is moving it. Deliveries that are failing, quarantined or
held are not gaps -- each has its own signal (retries and the dead-letter topic, the
breaker, the held depth and age) -- and delivered, dead-lettered, exhausted, rejected and
suppressed ones are settled. The sink's stored offsets (``sink_offsets``) are read here
too: they are the sink's progress for the monitor's lag.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["GAP_STATUSES", "Gap", "gap_summary", "list_gaps", "stored_offsets"]

GAP_STATUSES = ("pending", "released", "replayed")

_WHERE = """
  WHERE status = ANY(%(statuses)s)
    AND created_at < %(cutoff)s
    AND coalesce(status_at, created_at) < %(cutoff)s
"""


@dataclass(frozen=True, slots=True)
class Gap:
    delivery_id: str
    endpoint_id: str
    conversion_id: str
    status: str
    created_at: dt.datetime
    quiet_since: dt.datetime


def _params(now: dt.datetime, older_than_s: float) -> dict[str, Any]:
    return {"statuses": list(GAP_STATUSES), "cutoff": now - dt.timedelta(seconds=older_than_s)}


def gap_summary(conn: psycopg.Connection[Any], *, now: dt.datetime,
                older_than_s: float) -> tuple[int, float]:
    """(how many gaps, seconds since the oldest went quiet; 0.0 when there is none)."""
    row = conn.execute(
        "SELECT count(*), min(coalesce(status_at, created_at)) FROM deliveries" + _WHERE,
        _params(now, older_than_s)).fetchone()
    assert row is not None
    count, oldest = int(row[0]), row[1]
    return count, (now - oldest).total_seconds() if oldest is not None else 0.0


def list_gaps(conn: psycopg.Connection[Any], *, now: dt.datetime, older_than_s: float,
              limit: int, endpoint_id: str | None = None) -> list[Gap]:
    """The gaps, quiet longest first, at most ``limit``."""
    params = _params(now, older_than_s) | {"limit": limit, "endpoint": endpoint_id}
    rows = conn.execute(
        "SELECT delivery_id, endpoint_id, conversion_id, status, created_at,"
        " coalesce(status_at, created_at) AS quiet_since FROM deliveries" + _WHERE +
        "   AND (%(endpoint)s::text IS NULL OR endpoint_id = %(endpoint)s)"
        " ORDER BY quiet_since, delivery_id LIMIT %(limit)s", params).fetchall()
    return [Gap(*r) for r in rows]


def stored_offsets(conn: psycopg.Connection[Any]) -> dict[tuple[str, str, int], int]:
    """Every (group, topic, partition) -> next offset the sink stored."""
    rows = conn.execute(
        "SELECT consumer_group, topic, kafka_partition, next_offset FROM sink_offsets"
    ).fetchall()
    return {(str(g), str(t), int(p)): int(o) for g, t, p, o in rows}
