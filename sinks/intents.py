"""The sink's side of attempt intents (:mod:`postbacks.core.intents`): every request the agent
sent ends up in ``delivery_attempts``.

An intent (an Attempt record with result ``sending``) is kept in ``attempt_intents`` until
its attempt's record arrives (both read in one batch: it is never written at all). Each
flush, in the flush's transaction (so exactly once, with the offsets):

* the intents the batch's attempt records answer are deleted;
* the pending intents of the batch's deliveries are checked against the batch's records
  (another agent process attempting a delivery again means the first one's record is lost);
* a pending intent whose *dispatch* (delivery, attempt number and trigger) has a recorded
  attempt of another id is lost, whichever of the two was sent first: a dispatch's outputs
  are committed once, and here by that other attempt (a zombie agent, one still sending
  work of a partition a rebalance gave to another agent, sends after the new owner; an
  agent whose transaction aborted sends again under its own name); one whose own attempt
  row is stored already (another sink wrote it while this one still held the intent) is
  dropped;
* every ``sweep_s``, the same for every pending intent, then the intents pending longer
  than ``lost_after_s`` are lost.

A lost intent becomes a ``delivery_attempts`` row (result ``unknown``, error class
``agent_lost``, the intent's request) and stays in ``attempt_intents`` with ``lost_at`` for
a day: if its attempt record arrives after all, that row is deleted and the record written
in its place.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.core.intents import (
    INTENT,
    LOST_CLASS,
    UNKNOWN,
    Intent,
    Lost,
    Seen,
    lost_intents,
    lost_message,
)
from sinks.tables import ts_from_ms

__all__ = ["IntentBook"]

_COLS = ("attempt_id, attempted_at, delivery_id, endpoint_id, idempotency_key, attempt_no,"
         " trigger, agent_instance, queue_ms, request_method, request_url, request_headers,"
         " request_body")
_KEEP_LOST = "1 day"  # how long a lost intent waits for a late attempt record

# The attempt-log row of a lost intent: its request as the intent recorded it.
_WRITE_LOST = f"""
INSERT INTO delivery_attempts (attempt_id, attempted_at, delivery_id, endpoint_id,
    idempotency_key, attempt_no, trigger, result, status_code, error_class, error_message,
    queue_ms, platform_ms, wire_ms, request_method, request_url, request_headers,
    request_body, response_excerpt)
SELECT i.attempt_id, i.attempted_at, i.delivery_id, i.endpoint_id, i.idempotency_key,
    i.attempt_no, i.trigger, '{UNKNOWN}', NULL, '{LOST_CLASS}', m.msg, i.queue_ms, 0, 0,
    i.request_method, i.request_url, i.request_headers, i.request_body, NULL
FROM attempt_intents i JOIN unnest(%s::text[], %s::text[], %s::text[]) AS m(id, msg, why)
    ON m.id = i.attempt_id
WHERE i.lost_at IS NULL
ON CONFLICT DO NOTHING
"""
_MARK_LOST = """
UPDATE attempt_intents i SET lost_at = now(), lost_reason = m.why
FROM unnest(%s::text[], %s::text[]) AS m(id, why) WHERE i.attempt_id = m.id
    AND i.lost_at IS NULL
"""


# Pending intents whose dispatch has a recorded attempt: their own row (``mine``: answered
# already, by another sink) first, else another attempt's (lost: its outputs were committed).
_REDONE = f"""
SELECT DISTINCT ON (c.id) c.id, a.attempt_id, a.attempt_id = c.id AS mine
FROM unnest(%s::text[], %s::text[], %s::int[], %s::text[]) AS c(id, delivery_id, no, trig)
JOIN delivery_attempts a ON a.delivery_id = c.delivery_id AND a.attempt_no = c.no
    AND a.trigger = c.trig
WHERE a.attempted_at >= %s AND a.error_class IS DISTINCT FROM '{LOST_CLASS}'
ORDER BY c.id, (a.attempt_id = c.id) DESC, a.attempted_at
"""
_PENDING = ("SELECT attempt_id, delivery_id, attempted_at, agent_instance, attempt_no, trigger"
            " FROM attempt_intents WHERE lost_at IS NULL")
REDONE = "redone"  # a lost intent's reason: its dispatch was attempted and recorded again


def _ms(ts: Any) -> int:
    return int(ts.timestamp() * 1000)


class IntentBook:
    """Collects one batch's intents and attempt ids; :meth:`settle` writes them."""

    def __init__(self, lost_after_s: float, *, sweep_s: float = 10.0,
                 clock: Callable[[], float] = time.time,
                 ticks: Callable[[], float] = time.monotonic) -> None:
        self.lost_after_ms = int(lost_after_s * 1000)
        self.sweep_s = sweep_s
        self._clock = clock  # record times (the agents' attempted_at)
        self._ticks = ticks  # the sweep's schedule: a clock stepped back must not stop it
        self._last_sweep: float | None = None  # sweep at the first flush
        self._new: dict[str, tuple[Any, ...]] = {}  # intents read, not answered in batch
        self._answered: list[str] = []  # attempt ids whose intent may be stored
        self._seen: list[Seen] = []

    def add(self, value: Any) -> bool:
        """One Attempt record read; True when it is an intent (kept here, not an attempt
        row)."""
        instance = value.get("agent_instance")
        if instance is not None:
            self._seen.append(Seen(value["attempt_id"], value["delivery_id"],
                                   value["attempted_at"], instance))
        if value["result"] == INTENT:
            self._new[value["attempt_id"]] = (
                value["attempt_id"], ts_from_ms(value["attempted_at"]), value["delivery_id"],
                value["endpoint_id"], value["idempotency_key"], value["attempt_no"],
                value["trigger"], instance, value["queue_ms"], value["request_method"],
                value["request_url"], Jsonb(value["request_headers"]), value["request_body"])
            return True
        if self._new.pop(value["attempt_id"], None) is None and instance is not None:
            self._answered.append(value["attempt_id"])  # (no intent before v2 agents)
        return False

    def sweep_due(self) -> bool:
        return self._last_sweep is None or self._ticks() - self._last_sweep >= self.sweep_s

    def clear(self) -> None:
        self._new.clear()
        self._answered.clear()
        self._seen.clear()

    def answer(self, conn: psycopg.Connection[Any]) -> None:
        """Before the batch's attempt rows are written: delete the intents they answer, and
        the ``unknown`` rows of those judged lost already (the record takes their place)."""
        if not self._answered:
            return
        with conn.cursor() as cur:
            cur.execute("DELETE FROM attempt_intents WHERE attempt_id = ANY(%s)"
                        " RETURNING attempt_id, attempted_at, lost_at IS NOT NULL",
                        (self._answered,))
            late = [(a, at) for a, at, lost in cur.fetchall() if lost]
            if late:
                cur.executemany(
                    "DELETE FROM delivery_attempts WHERE attempt_id = %s AND attempted_at = %s"
                    f" AND result = '{UNKNOWN}' AND error_class = '{LOST_CLASS}'", late)

    def settle(self, conn: psycopg.Connection[Any]) -> list[Lost]:
        """After the batch's attempt rows: store its intents, write the ones lost now."""
        now_ms = int(self._clock() * 1000)
        with conn.cursor() as cur:
            pending: dict[str, _Pending] = {}
            deliveries = sorted({s.delivery_id for s in self._seen})
            if deliveries:
                cur.execute(_PENDING + " AND delivery_id = ANY(%s)", (deliveries,))
                pending.update(_pending(cur.fetchall()))
            if self._new:
                cur.executemany(f"INSERT INTO attempt_intents ({_COLS}) VALUES"
                                f" ({', '.join(['%s'] * 13)}) ON CONFLICT DO NOTHING",
                                list(self._new.values()))
                pending.update(_pending((r[0], r[2], r[1], r[7], r[5], r[6])
                                        for r in self._new.values()))
            lost, settled = self._redone(cur, pending)
            lost += lost_intents([p.intent for a, p in pending.items() if a not in settled],
                                 self._seen, now_ms=now_ms, lost_after_ms=self.lost_after_ms)
            if self.sweep_due():
                self._last_sweep = self._ticks()
                cur.execute(_PENDING + " AND attempted_at < %s",
                            (ts_from_ms(now_ms - int(self.sweep_s * 1000)),))
                known = {x.intent.attempt_id for x in lost}
                old = {a: p for a, p in _pending(cur.fetchall()).items() if a not in known}
                redone, settled = self._redone(cur, old)
                lost += redone
                lost += self._expired(cur, now_ms, known | settled)
            if lost:
                ids = [x.intent.attempt_id for x in lost]
                whys = [x.reason for x in lost]
                cur.execute(_WRITE_LOST, (ids, [_message(x) for x in lost], whys))
                cur.execute(_MARK_LOST, (ids, whys))
        self.clear()
        return lost

    def _redone(self, cur: psycopg.Cursor[Any],
                pending: dict[str, _Pending]) -> tuple[list[Lost], set[str]]:
        """The pending intents whose dispatch has a recorded attempt: lost when it is
        another attempt's, dropped when it is their own (answered already); and the ids of
        both."""
        if not pending:
            return [], set()
        cands = list(pending.values())
        # never before 1970: an intent another producer dated near year 1 put the bound
        # before the calendar Python can hold, and the sink died on it at every start
        since = max(0, min(p.intent.attempted_at_ms for p in cands) - self.lost_after_ms)
        cur.execute(_REDONE, ([p.intent.attempt_id for p in cands],
                              [p.intent.delivery_id for p in cands],
                              [p.attempt_no for p in cands], [p.trigger for p in cands],
                              ts_from_ms(since)))
        found: dict[str, tuple[str, bool]] = {c: (a, mine) for c, a, mine in cur.fetchall()}
        answered = [c for c, (_a, mine) in found.items() if mine]
        if answered:
            cur.execute("DELETE FROM attempt_intents WHERE attempt_id = ANY(%s)"
                        " AND lost_at IS NULL", (answered,))
        lost = [Lost(pending[c].intent, REDONE, a) for c, (a, mine) in found.items()
                if not mine]
        return lost, set(found)

    def _expired(self, cur: psycopg.Cursor[Any], now_ms: int, known: set[str]) -> list[Lost]:
        cur.execute("DELETE FROM attempt_intents WHERE lost_at < now() - %s::interval",
                    (_KEEP_LOST,))
        cur.execute("SELECT attempt_id, delivery_id, attempted_at, agent_instance"
                    " FROM attempt_intents WHERE lost_at IS NULL AND attempted_at < %s",
                    (ts_from_ms(now_ms - self.lost_after_ms),))
        old = [Intent(a, d, _ms(at), i) for a, d, at, i in cur.fetchall() if a not in known]
        return lost_intents(old, (), now_ms=now_ms, lost_after_ms=self.lost_after_ms)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A pending intent and its dispatch (with its delivery: what another attempt of the
    same dispatch shares)."""

    intent: Intent
    attempt_no: int
    trigger: str


def _pending(rows: Iterable[tuple[Any, ...]]) -> dict[str, _Pending]:
    """(attempt_id, delivery_id, attempted_at, agent_instance, attempt_no, trigger) rows by
    attempt id (each once)."""
    return {a: _Pending(Intent(a, d, _ms(at), i), no, trig) for a, d, at, i, no, trig in rows}


def _message(lost: Lost) -> str:
    """The error message of the ``unknown`` row written for a lost intent."""
    if lost.reason != REDONE:
        return lost_message(lost)
    agent = lost.intent.agent_instance or "an agent"
    return (f"{agent} sent it and its result was not recorded; the receiver may have"
            f" received it (the same dispatch was attempted again and recorded: {lost.by})")
