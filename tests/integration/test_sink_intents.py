"""The sink's attempt intents against PostgreSQL (sinks/intents.py): an intent answered by its
attempt leaves nothing behind; one whose agent died becomes an ``unknown`` / ``agent_lost``
attempt (at once when another agent process attempts the delivery again, else after the
bound); an attempt record arriving after all takes the ``unknown`` row's place."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from postbacks.core.outcomes import make_attempt
from postbacks.core.providers.base import RenderedRequest
from postbacks.db.connect import connect
from postbacks.ids import new_id
from postbacks.records import AttemptRecord
from postbacks.settings import Settings
from sinks.postgres import PostgresSink
from tests.unit.factories import make_delivery
from topics import TOPICS

REQ = RenderedRequest("POST", "https://example.test/hook", {"Content-Type": "application/json",
                                                            "webhook-id": "k"}, b'{"a":1}')


def _pair(ns: str, name: str, instance: str, at_ms: int) -> tuple[AttemptRecord, AttemptRecord]:
    """An intent and its attempt record (same attempt id)."""
    d = make_delivery(delivery_id=f"dlv_{ns}_{name}", endpoint_id=f"ep_{ns}")
    aid = new_id("att", at_ms)
    intent = make_attempt(d, now_ms=at_ms, result="sending", req=REQ, queue_ms=1.5,
                          attempt_id=aid, agent_instance=instance)
    final = make_attempt(d, now_ms=at_ms + 20, result="delivered", req=REQ, status=200,
                         attempted_at=at_ms + 2, attempt_id=aid, agent_instance=instance)
    return intent, final


class _Feed:
    def __init__(self, settings: Settings) -> None:
        self.sink = PostgresSink(settings, defer_s=0.0)
        self.topic = settings.topic(TOPICS.attempts.base)
        self.offset = 0

    def batch(self, *records: AttemptRecord) -> None:
        for r in records:
            self.sink.add_record(self.topic, 0, self.offset, r)
            self.offset += 1
        self.sink.flush(everything=True)


def _rows(settings: Settings, delivery_id: str) -> list[tuple[Any, ...]]:
    with connect(settings.database_url) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT attempt_id, result, error_class, idempotency_key, request_url, request_body,"
            " error_message FROM delivery_attempts WHERE delivery_id = %s ORDER BY attempted_at",
            (delivery_id,)).fetchall()]


def _intents(settings: Settings, delivery_id: str) -> list[tuple[Any, ...]]:
    with connect(settings.database_url) as conn:
        return [tuple(r) for r in conn.execute(
            "SELECT attempt_id, lost_reason FROM attempt_intents WHERE delivery_id = %s",
            (delivery_id,)).fetchall()]


def test_an_answered_intent_leaves_only_its_attempt(settings: Settings, namespace: str) -> None:
    feed = _Feed(settings)
    now = int(time.time() * 1000)
    same_i, same_f = _pair(namespace, "same", "a/r1", now)
    later_i, later_f = _pair(namespace, "later", "a/r1", now)
    try:
        feed.batch(same_i, same_f, later_i)  # one answered in the batch, one not yet
        assert _intents(settings, later_i["delivery_id"]) == [(later_i["attempt_id"], None)]
        assert _rows(settings, later_i["delivery_id"]) == []
        feed.batch(later_f)
    finally:
        feed.sink.close()
    for i in (same_i, later_i):
        assert _intents(settings, i["delivery_id"]) == []
        assert [r[:2] for r in _rows(settings, i["delivery_id"])] == [
            (i["attempt_id"], "delivered")]


def test_an_intent_superseded_by_another_agent_is_an_unknown_attempt(
        settings: Settings, namespace: str) -> None:
    feed = _Feed(settings)
    now = int(time.time() * 1000)
    lost, late = _pair(namespace, "d", "a/r1", now)
    again_i, again_f = _pair(namespace, "d", "a/r2", now + 500)  # the restarted agent
    try:
        feed.batch(lost)
        feed.batch(again_i)  # the re-sent copy's intent alone: the first is lost already
        rows = _rows(settings, lost["delivery_id"])
        assert [r[:4] for r in rows] == [
            (lost["attempt_id"], "unknown", "agent_lost", lost["idempotency_key"])]
        assert rows[0][4:6] == (REQ.url, REQ.body)  # the request as the intent had it
        assert "a/r1" in rows[0][6] and again_i["attempt_id"] in rows[0][6]
        feed.batch(again_f)
        # the first agent's record arrives after all: it replaces the unknown row
        feed.batch(late)
    finally:
        feed.sink.close()
    assert [r[:2] for r in _rows(settings, lost["delivery_id"])] == [
        (lost["attempt_id"], "delivered"), (again_i["attempt_id"], "delivered")]
    assert _intents(settings, lost["delivery_id"]) == []


def test_an_intent_with_no_result_is_written_after_the_bound(
        settings: Settings, namespace: str) -> None:
    feed = _Feed(dataclasses.replace(settings, attempt_lost_after_s=1.0))
    now = int(time.time() * 1000)
    lost, _ = _pair(namespace, "t", "a/r1", now)
    same_process, _ = _pair(namespace, "t", "a/r1", now + 10)  # a copy beside it
    try:
        feed.batch(lost, same_process)
        assert _rows(settings, lost["delivery_id"]) == []  # not superseded by its own agent
        time.sleep(1.2)
        feed.sink._intents._last_sweep = None  # the sweep is due (every 10 s otherwise)
        assert feed.sink.pending()
        feed.sink.flush()
    finally:
        feed.sink.close()
    rows = _rows(settings, lost["delivery_id"])
    assert sorted(r[:3] for r in rows) == sorted(
        [(lost["attempt_id"], "unknown", "agent_lost"),
         (same_process["attempt_id"], "unknown", "agent_lost")])
    assert all("in time" in r[6] for r in rows)
    assert {r[1] for r in _intents(settings, lost["delivery_id"])} == {"no_result"}


def test_an_intent_dated_at_the_start_of_the_calendar_does_not_stop_the_sink(
        settings: Settings, namespace: str) -> None:
    """Another producer's intent stamped within the lost-intent bound of 0001-01-01: the
    search for its redone attempts began before year 1, which Python cannot represent, and
    the sink died on the same record at every start."""
    feed = _Feed(settings)
    year_one_ms = -62135596800000 + 100_000
    d = make_delivery(delivery_id=f"dlv_{namespace}_y1", endpoint_id=f"ep_{namespace}")
    intent = make_attempt(d, now_ms=year_one_ms, result="sending", req=REQ,
                          attempt_id=f"att_{namespace}_y1", agent_instance="a1")
    feed.batch(intent)
    later, final = _pair(namespace, "after_y1", "a1", int(time.time() * 1000))
    feed.batch(later, final)  # the sink goes on
    assert [r[1] for r in _rows(settings, f"dlv_{namespace}_after_y1")] == ["delivered"]
