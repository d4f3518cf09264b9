"""The replay drainer: publishes queued replays to the first retry tier at a per-endpoint cap.

Replays are rows in ``replay_items`` (written by
:func:`~replay_console.actions.create_replay`). Each :meth:`Drainer.tick` refills one
token bucket per endpoint (``console_replay_rate_per_endpoint``/s, holding at most half a
second's worth, so a new bulk replay starts smoothly) and one for all endpoints
(``console_replay_rate_total``), takes the oldest queued items each endpoint may send now,
and publishes, in ONE Kafka transaction, each delivery (original id and idempotency key,
``trigger="manual"``, ``triggered_by`` = the job's actor, due now, the job's override) to
``retry.5s.v1`` plus a ``replayed`` outcome. Only after Kafka commits are the items marked
published in PostgreSQL, each with its ``replayed`` outcome's id: a crash in between
publishes them again (same idempotency key: the receiver's dedupe and the sink's keys
absorb it), never loses one. Until the sink has recorded that outcome, the console takes
the delivery's replay as in flight (:func:`~replay_console.actions.create_replay`).

One drainer runs at a time per deployment (a PostgreSQL advisory lock on the topic
prefix; a job is drained only by a drainer with the prefix it was created under): the
console server runs one in a thread; the CLI drains its own job when no server holds the
lock, else waits for it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_outcome
from postbacks.db.connect import connect
from postbacks.errors import ServiceUnavailable
from postbacks.kafka.publish import Item, TransactionalPublisher
from postbacks.metrics import CONSOLE_REPLAY_PENDING, CONSOLE_REPLAYED
from postbacks.settings import Settings
from replay_console.actions import redrivable
from replay_console.held import RELEASE_TIER, redrive_record
from topics import TOPICS

__all__ = ["DRAIN_LOCK", "Drainer", "run_drainer", "wait_for_job"]

log = logging.getLogger("postbacks.console.drain")

DRAIN_LOCK = 74_246_113  # with hashtext(topic prefix): held by the one running drainer
TICK_S = 0.2
BURST_S = 0.5  # a bucket holds half a second's worth: no flood after an idle spell


class Drainer:
    def __init__(self, settings: Settings, *, clock: Callable[[], float] = time.monotonic,
                 publisher: TransactionalPublisher | None = None) -> None:
        self.settings = settings
        self.clock = clock
        # a re-render waits two config refreshes: the agents render with the fixed config
        self.settle_ms = int(2000 * settings.config_refresh_s)
        self.publisher = publisher or TransactionalPublisher(settings, "console-replay")
        self.rate = settings.console_replay_rate_per_endpoint
        self.burst = max(1.0, self.rate * BURST_S)
        self.total_rate = settings.console_replay_rate_total
        self.total_burst = max(1.0, self.total_rate * BURST_S)
        self.tokens: dict[str, float] = {}
        self.turn = -1
        self.total_tokens = self.total_burst
        self.last = clock()
        self.retry_topic = settings.topic(TOPICS.retry_tier(RELEASE_TIER).base)
        self.outcome_topic = settings.topic(TOPICS.outcomes.base)

    def _refill(self) -> None:
        now = self.clock()
        dt = max(0.0, now - self.last)
        self.last = now
        for ep in list(self.tokens):
            t = self.tokens[ep] + dt * self.rate
            if t >= self.burst:
                del self.tokens[ep]  # full again: forget it
            else:
                self.tokens[ep] = t
        self.total_tokens = min(self.total_burst, self.total_tokens + dt * self.total_rate)

    def tick(self, conn: psycopg.Connection[Any]) -> int:
        """Publish what the caps allow now; returns how many were published."""
        self._refill()
        per_ep = int(self.burst)
        # Rank the narrow queue rows alone; join the jobs and the deliveries (snapshots)
        # only for the few rows each endpoint may send now.
        rows = conn.execute(
            "SELECT x.job_id, x.seq, x.delivery_id, x.endpoint_id, j.actor, j.override,"
            " d.idempotency_key, d.snapshot, d.created_at, d.attempt_count, d.status,"
            " EXISTS (SELECT 1 FROM postback_suppressions s"
            "         WHERE s.delivery_id = x.delivery_id AND s.resolved_at IS NULL), j.kind,"
            " x.rn"
            " FROM (SELECT i.job_id, i.seq, i.delivery_id, i.endpoint_id,"
            "        row_number() OVER (PARTITION BY i.endpoint_id"
            "                           ORDER BY j.created_at, i.job_id, i.seq) AS rn"
            "       FROM replay_items i JOIN replay_jobs j USING (job_id)"
            "       WHERE i.published_at IS NULL AND j.state = 'queued'"
            "         AND j.topic_prefix = %s) x"
            " JOIN replay_jobs j USING (job_id)"
            " LEFT JOIN deliveries d USING (delivery_id)"
            " WHERE x.rn <= %s ORDER BY x.rn, x.endpoint_id",
            (self.settings.topic_prefix, per_ep),
        ).fetchall()
        now_ms = int(time.time() * 1000)
        items: list[Item] = []
        done: list[tuple[str, int, str | None, str | None]] = []  # (.., error, outcome)
        dcodec, ocodec = codec_for("Delivery"), codec_for("Outcome")
        for (job_id, seq, delivery_id, endpoint_id, actor, override, key, snapshot,
             created_at, attempts, status, suppressed, kind) in self._fair(rows):
            if self.total_tokens < 1:
                break
            have = self.tokens.get(endpoint_id, self.burst)
            if have < 1:
                continue
            self.tokens[endpoint_id] = have - 1
            self.total_tokens -= 1
            if snapshot is None:
                done.append((job_id, seq, "delivery row is gone", None))
                continue
            if suppressed or not redrivable(status, kind):
                # changed since the replay was queued (held, suppressed, rejected, in flight)
                done.append((job_id, seq, "not replayed: it is now "
                             + ("suppressed" if suppressed else str(status)), None))
                continue
            try:
                d = redrive_record(
                    delivery_id=delivery_id, endpoint_id=endpoint_id, idempotency_key=key,
                    snapshot=dict(snapshot), created_at_ms=int(created_at.timestamp() * 1000),
                    attempt=attempts, trigger="manual", actor=actor, now_ms=now_ms,
                    override=None if override is None else json.dumps(override, sort_keys=True),
                )
            except ValueError as exc:
                done.append((job_id, seq, str(exc)[:500], None))
                continue
            if kind == "rerender":
                # re-rendered with the config just fixed: due once every agent has read it
                d["due_at"] = now_ms + self.settle_ms
            k = endpoint_id.encode()
            items.append((self.retry_topic, k, dcodec.encode(d)))
            outcome = make_outcome(d, "replayed", now_ms=now_ms, actor=actor,
                                   reason=f"replayed by {actor} (job {job_id})")
            items.append((self.outcome_topic, k, ocodec.encode(outcome)))
            done.append((job_id, seq, None, outcome["outcome_id"]))
        if not done:
            return 0
        self.publisher.publish(items)  # raises ServiceUnavailable: nothing marked
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                "UPDATE replay_items SET published_at = now(), error = %s, outcome_id = %s"
                " WHERE job_id = %s AND seq = %s",
                [(err, oid, job, seq) for job, seq, err, oid in done],
            )
            jobs: dict[str, int] = {}
            for job, _seq, _err, _oid in done:
                jobs[job] = jobs.get(job, 0) + 1
            cur.executemany(
                "UPDATE replay_jobs SET published = published + %s,"
                " state = CASE WHEN published + %s >= total THEN 'done' ELSE state END,"
                " finished_at = CASE WHEN published + %s >= total THEN now() END"
                " WHERE job_id = %s", [(n, n, n, job) for job, n in jobs.items()],
            )
        sent = sum(1 for _j, _s, err, _o in done if err is None)
        CONSOLE_REPLAYED.inc(sent)
        return sent

    def _fair(self, rows: list[Any]) -> list[Any]:
        """Rows in serving order: each endpoint's oldest first (``rn``); within one ``rn``,
        endpoints in a rotating order, so a total cap below the sum of the per-endpoint
        caps does not always serve the same endpoints first."""
        self.turn += 1
        out: list[Any] = []
        i = 0
        while i < len(rows):
            j = i
            while j < len(rows) and rows[j][-1] == rows[i][-1]:
                j += 1
            group = [r[:-1] for r in rows[i:j]]
            k = self.turn % len(group)
            out += group[k:] + group[:k]
            i = j
        return out

    def pending(self, conn: psycopg.Connection[Any]) -> int:
        row = conn.execute("SELECT coalesce(sum(total - published), 0) FROM replay_jobs"
                           " WHERE state = 'queued' AND topic_prefix = %s",
                           (self.settings.topic_prefix,)).fetchone()
        n = int(row[0]) if row else 0
        CONSOLE_REPLAY_PENDING.set(n)
        return n


def _try_lock(conn: psycopg.Connection[Any], prefix: str) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                       (DRAIN_LOCK, prefix)).fetchone()
    conn.commit()
    return bool(row and row[0])


def run_drainer(settings: Settings, stop: threading.Event, *,
                until_job: str | None = None,
                progress: Callable[[dict[str, Any]], None] | None = None) -> bool:
    """Drain queued replays until ``stop`` (or, with ``until_job``, until that job is
    done; returns False if another drainer holds the lock, so the caller waits instead).
    Database or Kafka trouble is logged and retried, never fatal."""
    from replay_console.actions import job_status

    drainer: Drainer | None = None
    while not stop.is_set():
        try:
            with connect(settings.database_url, kept=True) as conn:  # held for hours
                if not _try_lock(conn, settings.topic_prefix):
                    if until_job is not None:
                        return False
                    stop.wait(2.0)
                    continue
                drainer = drainer or Drainer(settings)
                last_pending = -1.0
                while not stop.is_set():
                    sent = drainer.tick(conn)
                    conn.commit()
                    if until_job is not None:
                        status = job_status(conn, until_job)
                        conn.commit()
                        if progress:
                            progress(status)
                        if status["state"] == "done":
                            return True
                    if time.monotonic() - last_pending > 1.0:
                        drainer.pending(conn)
                        conn.commit()
                        last_pending = time.monotonic()
                    if not sent:
                        stop.wait(TICK_S)
                    else:
                        stop.wait(TICK_S / 4)
        except (psycopg.Error, ServiceUnavailable) as exc:
            log.warning("replay drainer: %s; retrying in 2 s", exc)
            stop.wait(2.0)
        except Exception:  # never let the drainer thread die silently
            log.exception("replay drainer failed; restarting it in 5 s")
            drainer = None
            stop.wait(5.0)
    return True


def wait_for_job(settings: Settings, job_id: str, stop: threading.Event, *,
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 timeout_s: float | None = None) -> dict[str, Any]:
    """Block until ``job_id`` is published: drain it here, or wait for the drainer that
    holds the lock. Returns the job's final status (or the last seen, on timeout/stop)."""
    from replay_console.actions import job_status

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    if run_drainer(settings, stop, until_job=job_id, progress=progress):
        with connect(settings.database_url) as conn:
            return job_status(conn, job_id)
    with connect(settings.database_url) as conn:
        while True:
            status = job_status(conn, job_id)
            conn.commit()
            if progress:
                progress(status)
            if status["state"] == "done" or stop.is_set() or (
                    deadline is not None and time.monotonic() > deadline):
                return status
            stop.wait(0.5)
