"""The sink's side of attempt intents (:mod:`postbacks.core.intents`): every request the agent
sent ends up in ``delivery_attempts``.

An intent (an Attempt record with result ``sending``) is kept in ``attempt_intents`` until
its attempt's record arrives (both read in one batch: it is never written at all). Each
flush, in the flush's transaction (so exactly once, with the offsets): the intents the
batch's attempt records answer are deleted; the pending intents of the batch's deliveries
are checked against the batch's records (another agent process attempting a delivery again
means the first one's record is lost); and every ``sweep_s``, the intents pending longer
than ``lost_after_s``. A lost intent becomes a ``delivery_attempts`` row (result
``unknown``, error class ``agent_lost``, the intent's request) and stays in
``attempt_intents`` with ``lost_at`` for a day: if its attempt record arrives after all,
that row is deleted and the record written in its place.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


def _ms(ts: Any) -> int:
    return int(ts.timestamp() * 1000)


class IntentBook:
    """Collects one batch's intents and attempt ids; :meth:`settle` writes them."""

    def __init__(self, lost_after_s: float, *, sweep_s: float = 10.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.lost_after_ms = int(lost_after_s * 1000)
        self.sweep_s = sweep_s
        self._clock = clock
        self._last_sweep = 0.0  # sweep at the first flush
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
        return self._clock() - self._last_sweep >= self.sweep_s

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
            pending: list[Intent] = []
            deliveries = sorted({s.delivery_id for s in self._seen})
            if deliveries:
                cur.execute("SELECT attempt_id, delivery_id, attempted_at, agent_instance"
                            " FROM attempt_intents WHERE lost_at IS NULL"
                            " AND delivery_id = ANY(%s)", (deliveries,))
                pending = [Intent(a, d, _ms(at), i) for a, d, at, i in cur.fetchall()]
            if self._new:
                cur.executemany(f"INSERT INTO attempt_intents ({_COLS}) VALUES"
                                f" ({', '.join(['%s'] * 13)}) ON CONFLICT DO NOTHING",
                                list(self._new.values()))
                pending += [Intent(r[0], r[2], _ms(r[1]), r[7]) for r in self._new.values()]
            lost = lost_intents(pending, self._seen, now_ms=now_ms,
                                lost_after_ms=self.lost_after_ms)
            if self.sweep_due():
                self._last_sweep = self._clock()
                lost += self._expired(cur, now_ms, {x.intent.attempt_id for x in lost})
            if lost:
                ids = [x.intent.attempt_id for x in lost]
                whys = [x.reason for x in lost]
                cur.execute(_WRITE_LOST, (ids, [lost_message(x) for x in lost], whys))
                cur.execute(_MARK_LOST, (ids, whys))
        self.clear()
        return lost

    def _expired(self, cur: psycopg.Cursor[Any], now_ms: int, known: set[str]) -> list[Lost]:
        cur.execute("DELETE FROM attempt_intents WHERE lost_at < now() - %s::interval",
                    (_KEEP_LOST,))
        cur.execute("SELECT attempt_id, delivery_id, attempted_at, agent_instance"
                    " FROM attempt_intents WHERE lost_at IS NULL AND attempted_at < %s",
                    (ts_from_ms(now_ms - self.lost_after_ms),))
        old = [Intent(a, d, _ms(at), i) for a, d, at, i in cur.fetchall() if a not in known]
        return lost_intents(old, (), now_ms=now_ms, lost_after_ms=self.lost_after_ms)
