"""The sink's intents against PostgreSQL when one dispatch is attempted twice
(sinks/intents.py): the intent whose result was never recorded becomes an ``unknown`` /
``agent_lost`` attempt as soon as the dispatch's other attempt is recorded, whichever was
sent first and whichever agent process sent it; an intent whose attempt row is stored
already is dropped; a copy of another dispatch of the delivery is left to wait."""

from __future__ import annotations

import time

from postbacks.core.outcomes import make_attempt
from postbacks.db.connect import connect
from postbacks.ids import new_id
from postbacks.records import AttemptRecord
from postbacks.settings import Settings
from tests.integration.test_sink_intents import REQ, _Feed, _intents, _rows
from tests.unit.factories import make_delivery


def _pair(ns: str, name: str, instance: str, at_ms: int, *, trigger: str = "initial",
          attempt: int = 0) -> tuple[AttemptRecord, AttemptRecord]:
    """An intent and its attempt record (same attempt id) of one dispatch of a delivery."""
    d = make_delivery(delivery_id=f"dlv_{ns}_{name}", endpoint_id=f"ep_{ns}",
                      idempotency_key=f"msg_{ns}_{name}", trigger=trigger, attempt=attempt)
    aid = new_id("att", at_ms)
    intent = make_attempt(d, now_ms=at_ms, result="sending", req=REQ, queue_ms=1.5,
                          attempt_id=aid, agent_instance=instance)
    final = make_attempt(d, now_ms=at_ms + 20, result="delivered", req=REQ, status=200,
                         attempted_at=at_ms + 2, attempt_id=aid, agent_instance=instance)
    return intent, final


def _lost(settings: Settings, delivery_id: str) -> list[tuple[str, str | None]]:
    return sorted((a, why) for a, why in _intents(settings, delivery_id))


def test_a_zombie_send_after_the_new_owner_recorded_the_dispatch_is_in_the_log(
        settings: Settings, namespace: str) -> None:
    """The new owner of the partition attempts and records the dispatch; the agent that lost
    the partition sends it afterwards and its record is never committed."""
    feed = _Feed(settings)
    now = int(time.time() * 1000)
    owner_i, owner_f = _pair(namespace, "z", "b/r1", now)
    zombie, _never = _pair(namespace, "z", "a/r1", now + 900)  # later, another process
    try:
        feed.batch(owner_i, owner_f)
        feed.batch(zombie)
        rows = _rows(settings, zombie["delivery_id"])
        assert [r[:4] for r in rows] == [
            (owner_i["attempt_id"], "delivered", None, owner_i["idempotency_key"]),
            (zombie["attempt_id"], "unknown", "agent_lost", zombie["idempotency_key"])]
        assert "a/r1" in rows[1][6] and owner_i["attempt_id"] in rows[1][6]
        assert _lost(settings, zombie["delivery_id"]) == [(zombie["attempt_id"], "redone")]
        # in one batch too, the owner's record read after the zombie's intent
        z2_owner_i, z2_owner_f = _pair(namespace, "z2", "b/r1", now)
        z2_zombie, _ = _pair(namespace, "z2", "a/r1", now + 900)
        feed.batch(z2_owner_i, z2_zombie, z2_owner_f)
    finally:
        feed.sink.close()
    assert [r[:3] for r in _rows(settings, z2_zombie["delivery_id"])] == [
        (z2_owner_i["attempt_id"], "delivered", None),
        (z2_zombie["attempt_id"], "unknown", "agent_lost")]


def test_a_send_again_by_the_same_process_settles_its_first_intent(
        settings: Settings, namespace: str) -> None:
    """An agent whose transaction aborted (or whose partition came back to it in a
    rebalance) sends the dispatch again under its own name: the first intent is lost once
    the second attempt is recorded, and its record arriving after all replaces that row."""
    feed = _Feed(settings)
    now = int(time.time() * 1000)
    first, late = _pair(namespace, "s", "a/r1", now)
    again_i, again_f = _pair(namespace, "s", "a/r1", now + 300)
    try:
        feed.batch(first)
        feed.batch(again_i)  # its own process: not superseded by an intent alone
        assert _rows(settings, first["delivery_id"]) == []
        feed.batch(again_f)
        assert [r[:3] for r in _rows(settings, first["delivery_id"])] == [
            (first["attempt_id"], "unknown", "agent_lost"),
            (again_i["attempt_id"], "delivered", None)]
        assert _lost(settings, first["delivery_id"]) == [(first["attempt_id"], "redone")]
        feed.batch(late)
    finally:
        feed.sink.close()
    assert [r[:2] for r in _rows(settings, first["delivery_id"])] == [
        (first["attempt_id"], "delivered"), (again_i["attempt_id"], "delivered")]
    assert _intents(settings, first["delivery_id"]) == []


def test_an_intent_whose_attempt_is_stored_already_is_dropped(
        settings: Settings, namespace: str) -> None:
    """Two sinks during a rebalance: the new owner wrote the attempt (intent and record in
    one batch) and the old one stores the intent it still held afterwards."""
    feed = _Feed(settings)
    now = int(time.time() * 1000)
    intent, final = _pair(namespace, "o", "a/r1", now)
    other, _ = _pair(namespace, "o", "b/r1", now + 400)  # and a later copy of another agent
    try:
        feed.batch(intent, final)
        feed.batch(intent, other)  # not superseded by it either: it is answered
    finally:
        feed.sink.close()
    assert [r[:2] for r in _rows(settings, intent["delivery_id"])] == [
        (intent["attempt_id"], "delivered"), (other["attempt_id"], "unknown")]
    assert _lost(settings, intent["delivery_id"]) == [(other["attempt_id"], "redone")]


def test_a_copy_of_another_dispatch_still_waits_for_its_record(
        settings: Settings, namespace: str) -> None:
    """A replay sent beside a retry of the same delivery by one process: different
    dispatches, so the retry's record does not settle the replay's intent."""
    feed = _Feed(settings)
    now = int(time.time() * 1000)
    retry_i, retry_f = _pair(namespace, "c", "a/r1", now, trigger="retry", attempt=2)
    replay_i, replay_f = _pair(namespace, "c", "a/r1", now + 5, trigger="replay", attempt=2)
    later_i, later_f = _pair(namespace, "c", "a/r1", now + 10, trigger="retry", attempt=3)
    try:
        feed.batch(retry_i, replay_i, retry_f, later_i, later_f)
        assert _lost(settings, replay_i["delivery_id"]) == [(replay_i["attempt_id"], None)]
        feed.batch(replay_f)
    finally:
        feed.sink.close()
    assert sorted(r[1] for r in _rows(settings, replay_i["delivery_id"])) == ["delivered"] * 3
    assert _intents(settings, replay_i["delivery_id"]) == []


def test_the_sweep_settles_an_intent_whose_dispatch_another_sink_recorded(
        settings: Settings, namespace: str) -> None:
    """The dispatch's other attempt was committed by another sink in a transaction this
    one did not see: the sweep (every ``sweep_s``) finds it."""
    feed = _Feed(settings)
    old = int(time.time() * 1000) - 30_000  # older than the sweep's 10 s
    intent, _never = _pair(namespace, "w", "a/r1", old)
    other = new_id("att", old + 500)
    try:
        feed.batch(intent)
        with connect(settings.database_url) as conn:  # what the other sink wrote
            conn.execute(
                "INSERT INTO delivery_attempts (attempt_id, attempted_at, delivery_id,"
                " endpoint_id, idempotency_key, attempt_no, trigger, result, status_code,"
                " queue_ms, platform_ms, wire_ms, request_method, request_url,"
                " request_headers) SELECT %s, attempted_at + interval '500 ms', delivery_id,"
                " endpoint_id, idempotency_key, attempt_no, trigger, 'delivered', 200, 0, 0,"
                " 0, request_method, request_url, request_headers FROM attempt_intents"
                " WHERE attempt_id = %s", (other, intent["attempt_id"]))
        assert _lost(settings, intent["delivery_id"]) == [(intent["attempt_id"], None)]
        feed.sink._intents._last_sweep = None  # the sweep is due
        assert feed.sink.pending()
        feed.sink.flush()
    finally:
        feed.sink.close()
    assert [r[:3] for r in _rows(settings, intent["delivery_id"])] == [
        (intent["attempt_id"], "unknown", "agent_lost"), (other, "delivered", None)]
    assert _lost(settings, intent["delivery_id"]) == [(intent["attempt_id"], "redone")]
