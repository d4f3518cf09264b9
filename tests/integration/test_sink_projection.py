"""The sink's status projection on ``deliveries``, against PostgreSQL: the latest outcome
decides the status whatever order records arrive in, the attempt count never goes down,
held and suppressed outcomes fill their columns and table, and a touched delivery whose
projection did not change is not rewritten. Deferred rows: a delivery row waits for its
first outcome and is then inserted already projected (never updated), or
written as pending after ``defer_s`` or beyond ``defer_max``; the offsets stored never
pass a waiting row."""

from __future__ import annotations

import random
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message, TopicPartition

import sinks.projection as projection_module
import sinks.waiting as waiting_module
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from sinks.postgres import PostgresSink
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

T0 = 1_750_000_000_000


class Feed:
    """Decoded records into a real sink (offsets are irrelevant here), flushed on demand."""

    def __init__(self, settings: Settings, defer_s: float = 0.0, defer_max: int = 1000,
                 final_from: int = 0) -> None:
        self.sink = PostgresSink(settings, defer_s=defer_s, defer_max=defer_max)
        self.settings = settings
        self.offset = 0
        for p in (0, 1):  # as if given the partitions when their end was ``final_from``
            self.sink._waiting.final_from((settings.topic(TOPICS.deliveries.base), p),
                                          final_from)

    def add(self, topic_base: str, value: Any, partition: int = 0) -> int:
        self.offset += 1
        self.sink.add_record(self.settings.topic(topic_base), partition, self.offset, value)
        return self.offset

    def flush(self, everything: bool = False) -> None:
        self.sink.flush(everything)

    def close(self) -> None:
        self.sink.close()


def _delivery(ns: str, name: str) -> Any:
    return make_delivery(delivery_id=f"dlv_{ns}_{name}", endpoint_id=f"ep_{ns}",
                         conversion=make_conversion(conversion_id=f"cv_{ns}_{name}"))


def _attempt(d: Any, no: int, at: int, error: str | None) -> Any:
    a = make_attempt({**d, "attempt": no - 1}, now_ms=at, attempted_at=at,
                     result="delivered" if error is None else "retry", req=None,
                     error_class=error)
    return a


def _row(settings: Settings, d: Any) -> dict[str, Any]:
    with connect(settings.database_url) as conn:
        cur = conn.execute(
            "SELECT status, attempt_count, last_error, hold_reason, held_at IS NOT NULL,"
            " xmin::text, (SELECT count(*) FROM postback_suppressions s"
            "  WHERE s.delivery_id = d.delivery_id)"
            " FROM deliveries d WHERE delivery_id = %s", (d["delivery_id"],))
        r = cur.fetchone()
    assert r is not None, f"{d['delivery_id']} not stored"
    return dict(zip(("status", "attempts", "error", "reason", "held", "xmin", "suppressions"),
                    r, strict=True))


def test_projection_follows_the_latest_outcome_in_any_arrival_order(
        settings: Settings, namespace: str) -> None:
    f = Feed(settings)
    retried, late, held, early, tie, quiet, supp = (
        _delivery(namespace, n) for n in ("retried", "late", "held", "early", "tie", "quiet",
                                          "supp"))
    for d in (retried, late, held, tie, quiet, supp):
        f.add(TOPICS.deliveries.base, d)
    # the outcome (and attempt) of `early` arrive before its delivery row
    f.add(TOPICS.attempts.base, _attempt(early, 1, T0, None))
    f.add(TOPICS.outcomes.base, make_outcome(early, "delivered", now_ms=T0 + 1))
    # retried: a failure, then success, in one batch
    f.add(TOPICS.attempts.base, _attempt(retried, 1, T0, "http_5xx"))
    f.add(TOPICS.outcomes.base, make_outcome(retried, "failing", now_ms=T0 + 1))
    f.add(TOPICS.attempts.base, _attempt(retried, 2, T0 + 5000, None))
    retried_delivered = make_outcome(retried, "delivered", now_ms=T0 + 5001)
    f.add(TOPICS.outcomes.base, retried_delivered)
    # late: the newer outcome and attempt first ...
    f.add(TOPICS.attempts.base, _attempt(late, 2, T0 + 5000, None))
    f.add(TOPICS.outcomes.base, make_outcome(late, "delivered", now_ms=T0 + 5001))
    f.add(TOPICS.outcomes.base, make_outcome(held, "held", now_ms=T0, reason="retrodated"))
    f.add(TOPICS.outcomes.base, make_outcome(supp, "suppressed", now_ms=T0,
                                             reason="unknown macro"))
    f.flush()
    quiet_before = _row(settings, quiet)
    assert quiet_before["status"] == "pending"

    # ... the older ones in a later batch, which must not win
    f.add(TOPICS.attempts.base, _attempt(late, 1, T0, "timeout"))
    f.add(TOPICS.outcomes.base, make_outcome(late, "failing", now_ms=T0 + 1))
    f.add(TOPICS.deliveries.base, early)
    # tie on occurred_at: the higher outcome id wins (ids grow with time, then randomly)
    a = make_outcome(tie, "failing", now_ms=T0)
    b = make_outcome(tie, "delivered", now_ms=T0)
    first, second = sorted((a, b), key=lambda o: o["outcome_id"])
    second = {**second, "occurred_at": first["occurred_at"]}
    f.add(TOPICS.outcomes.base, second)
    f.add(TOPICS.outcomes.base, first)
    f.add(TOPICS.outcomes.base, make_outcome(held, "delivered", now_ms=T0 + 60_000,
                                             actor="ops"))  # released and sent
    f.add(TOPICS.outcomes.base, make_outcome(supp, "suppressed", now_ms=T0 + 1,
                                             reason="second"))
    f.add(TOPICS.deliveries.base, quiet)  # touched again, nothing to change
    f.flush()

    assert _row(settings, retried) | {"xmin": None} == {
        "status": "delivered", "attempts": 2, "error": None, "reason": None, "held": False,
        "xmin": None, "suppressions": 0}
    late_row = _row(settings, late)
    assert (late_row["status"], late_row["attempts"], late_row["error"]) == ("delivered", 2, None)
    early_row = _row(settings, early)
    assert (early_row["status"], early_row["attempts"]) == ("delivered", 1)
    assert _row(settings, tie)["status"] == second["kind"]
    held_row = _row(settings, held)
    assert (held_row["status"], held_row["reason"], held_row["held"]) == (
        "delivered", "retrodated", True)  # the hold stays on record after the release
    supp_row = _row(settings, supp)
    assert (supp_row["status"], supp_row["suppressions"]) == ("suppressed", 1)
    with connect(settings.database_url) as conn:
        reason = conn.execute("SELECT reason FROM postback_suppressions WHERE delivery_id = %s",
                              (supp["delivery_id"],)).fetchone()
    assert reason == ("unknown macro",)  # the first suppression is the one kept
    assert _row(settings, quiet) == quiet_before  # no outcome, no attempt: not rewritten

    before = _row(settings, retried)  # a replayed outcome changes nothing: no new version
    f.add(TOPICS.outcomes.base, retried_delivered)
    f.flush()
    assert _row(settings, retried) == before

    with connect(settings.database_url) as conn:  # attempt 2's partition dropped (retention)
        conn.execute("DELETE FROM delivery_attempts WHERE delivery_id = %s AND attempt_no = 2",
                     (retried["delivery_id"],))
        conn.commit()
    f.add(TOPICS.outcomes.base, retried_delivered)  # touched again
    f.flush()
    assert _row(settings, retried)["attempts"] == 2  # the count is never lowered

    with connect(settings.database_url) as conn:  # the timestamps come from the outcomes
        got = conn.execute(
            "SELECT extract(epoch FROM status_at) * 1000, extract(epoch FROM held_at) * 1000"
            " FROM deliveries WHERE delivery_id = %s", (held["delivery_id"],)).fetchone()
    assert got is not None and (int(got[0]), int(got[1])) == (T0 + 60_000, T0)
    f.close()


def test_a_held_delivery_shows_its_hold(settings: Settings, namespace: str) -> None:
    f = Feed(settings)
    d = _delivery(namespace, "hold")
    f.add(TOPICS.deliveries.base, d)
    f.add(TOPICS.outcomes.base, make_outcome(d, "held", now_ms=T0, reason="value_rate"))
    f.flush()
    row = _row(settings, d)
    assert (row["status"], row["reason"], row["held"]) == ("held", "value_rate", True)
    f.close()


def _attempt_partitions_read(settings: Settings, ids: list[str]) -> list[str]:
    """The attempts partitions the projection statement reads for ``ids``, by EXPLAIN
    ANALYZE inside a rolled-back transaction."""
    from sinks.projection import PROJECT

    with connect(settings.database_url) as conn:
        (plan,), = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + PROJECT,
                                {"ids": ids}).fetchall()
        conn.rollback()
    read: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        rel = node.get("Relation Name", "")
        if rel.startswith("delivery_attempts") and node.get("Actual Loops", 0) > 0:
            read.append(rel)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return read


def test_the_attempt_lookup_reads_only_the_days_a_delivery_can_have_attempts_on(
        settings: Settings, namespace: str) -> None:
    """Attempts are partitioned by day and every partition is kept (and a week is made
    ahead): the projection looks for a delivery's attempts from its creation (less an hour)
    to a day past now, so its cost does not grow with the days kept."""
    import time as _time

    now = int(_time.time() * 1000)
    # The sink makes yesterday's partition and a week ahead (ensure_attempt_partitions);
    # in a database older than a day, earlier days are there too.
    with connect(settings.database_url) as conn:
        conn.execute("SELECT postbacks_ensure_attempt_partitions(current_date - 1, 9)")
        conn.commit()
        days = [r[0] for r in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'delivery_attempts'::regclass").fetchall()]
    assert len(days) >= 10
    f = Feed(settings)
    d = make_delivery(delivery_id=f"dlv_{namespace}_days", endpoint_id=f"ep_{namespace}",
                      conversion=make_conversion(conversion_id=f"cv_{namespace}_days"),
                      created_at=now)
    f.add(TOPICS.deliveries.base, d)
    f.add(TOPICS.attempts.base, _attempt(d, 1, now + 1000, "http_500"))
    f.add(TOPICS.outcomes.base, make_outcome(d, "failing", now_ms=now + 1000))
    f.flush()
    f.add(TOPICS.attempts.base, _attempt(d, 2, now + 2000, None))  # a retry, row stored
    f.add(TOPICS.outcomes.base, make_outcome(d, "delivered", now_ms=now + 2000))
    f.flush()
    row = _row(settings, d)
    assert (row["status"], row["attempts"], row["error"]) == ("delivered", 2, None)

    read = _attempt_partitions_read(settings, [d["delivery_id"]])
    # today's (and yesterday's within an hour after midnight, tomorrow's near the end of
    # the day in the session's zone): never the days ahead, or the default
    assert read, "the attempt lookup read no partition"
    assert len(read) <= 3 and "delivery_attempts_default" not in read, read
    # a delivery with no row: nothing to update, no partition read
    assert _attempt_partitions_read(settings, [f"dlv_{namespace}_none"]) == []
    f.close()


def test_a_duplicate_delivery_record_does_not_narrow_the_attempt_lookup(
        settings: Settings, namespace: str) -> None:
    """A conversion fanned out again gives the same delivery a newer creation time; the
    stored row keeps the first. An attempt of the first, read in the duplicate's batch, is
    still counted: the lookup starts from the stored creation."""
    import time as _time

    now = int(_time.time() * 1000)
    first = make_delivery(delivery_id=f"dlv_{namespace}_dup", endpoint_id=f"ep_{namespace}",
                          conversion=make_conversion(conversion_id=f"cv_{namespace}_dup"),
                          created_at=now - 3 * 3600_000)
    f = Feed(settings)
    f.add(TOPICS.deliveries.base, first)
    f.add(TOPICS.attempts.base, _attempt(first, 1, now - 3 * 3600_000 + 1000, "http_500"))
    f.add(TOPICS.outcomes.base, make_outcome(first, "failing", now_ms=now - 3 * 3600_000))
    f.flush()
    f.add(TOPICS.deliveries.base, {**first, "created_at": now})  # the duplicate
    f.add(TOPICS.attempts.base, _attempt(first, 3, now - 2 * 3600_000, "timeout"))
    f.add(TOPICS.outcomes.base, make_outcome(first, "failing", now_ms=now - 2 * 3600_000))
    f.flush()
    row = _row(settings, first)
    assert (row["attempts"], row["error"]) == (3, "timeout")
    f.close()


def _projected(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The ids of each projection statement the sink runs from now on."""
    calls: list[list[str]] = []
    real = projection_module.project_status

    def spy(conn: Any, ids: list[str], suppressed: list[str] | None = None) -> None:
        calls.append(list(ids))
        real(conn, ids, suppressed)

    monkeypatch.setattr(projection_module, "project_status", spy)
    return calls


def test_a_settled_row_skips_the_projection_unless_a_stored_row_stands_in_its_way(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row released with its delivered outcome and the attempt that outcome reports is
    final: the projection statement (a third of PostgreSQL's work per delivery) is not run
    for it. When a stored row of the same delivery is in the way (a conversion fanned out
    again, a row read again), the insert leaves that row as it was, so it is projected."""
    calls = _projected(monkeypatch)
    f = Feed(settings, defer_s=3600)
    ok, retried = _delivery(namespace, "ok"), _delivery(namespace, "retried")
    f.add(TOPICS.deliveries.base, ok)
    f.add(TOPICS.attempts.base, _attempt(ok, 1, T0, None))
    f.add(TOPICS.outcomes.base, make_outcome(ok, "delivered", now_ms=T0 + 1))
    f.add(TOPICS.deliveries.base, retried)
    f.add(TOPICS.attempts.base, _attempt(retried, 1, T0, "http_500"))
    f.add(TOPICS.outcomes.base, make_outcome(retried, "failing", now_ms=T0 + 1))
    f.flush()
    assert [i for c in calls for i in c] == [retried["delivery_id"]]
    r = _row(settings, ok)
    assert (r["status"], r["attempts"], r["error"]) == ("delivered", 1, None)
    r = _row(settings, retried)
    assert (r["status"], r["attempts"], r["error"]) == ("failing", 1, "http_500")

    calls.clear()  # the same delivery again, delivered by its second attempt
    f.add(TOPICS.deliveries.base, {**retried, "created_at": T0 + 4000})
    f.add(TOPICS.attempts.base, _attempt(retried, 2, T0 + 5000, None))
    f.add(TOPICS.outcomes.base, make_outcome(retried, "delivered", now_ms=T0 + 5001,
                                             attempt_no=2))
    f.flush()
    assert [i for c in calls for i in c] == [retried["delivery_id"]]
    r = _row(settings, retried)
    assert (r["status"], r["attempts"], r["error"]) == ("delivered", 2, None)
    f.close()


def test_a_row_whose_delivered_outcome_comes_before_its_attempt_waits_for_it_and_is_final(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent writes an attempt and its outcome in one transaction to two topics, which
    the sink reads side by side: a ``delivered`` outcome read first keeps the row waiting
    for the attempt it reports, and the row then goes out final. A row that cannot be
    final does not wait; one whose attempt never comes goes out after ``defer_s``."""
    calls = _projected(monkeypatch)
    f = Feed(settings, defer_s=3600)
    ok, first, failing = (_delivery(namespace, n) for n in ("ok", "first", "failing"))
    f.add(TOPICS.deliveries.base, ok)
    f.add(TOPICS.outcomes.base, make_outcome(ok, "delivered", now_ms=T0 + 1))
    assert _write_counts(f) == (0, 0)  # waiting for attempt 1
    assert f.sink.waiting() == 1
    f.add(TOPICS.attempts.base, _attempt(ok, 1, T0, None))
    assert _write_counts(f) == (1, 0)
    assert calls == []  # final: no projection
    r = _row(settings, ok)
    assert (r["status"], r["attempts"], r["error"]) == ("delivered", 1, None)

    # an attempt of the delivery read before its row: never final, so no wait
    f.add(TOPICS.attempts.base, _attempt(first, 1, T0, None))
    f.add(TOPICS.deliveries.base, first)
    f.add(TOPICS.outcomes.base, make_outcome(first, "delivered", now_ms=T0 + 1))
    assert _write_counts(f)[0] == 1  # at once (and projected: the attempt count moves)
    assert [i for c in calls for i in c] == [first["delivery_id"]]
    r = _row(settings, first)
    assert (r["status"], r["attempts"]) == ("delivered", 1)
    # an outcome that reports no new attempt (failing: its attempt failed) is not waited on
    calls.clear()
    f.add(TOPICS.deliveries.base, failing)
    f.add(TOPICS.outcomes.base, make_outcome(failing, "failing", now_ms=T0 + 1))
    assert _write_counts(f) == (1, 0)
    assert _row(settings, failing)["status"] == "failing"
    f.close()

    f = Feed(settings, defer_s=1.0)  # the attempt never comes (read by another sink, say)
    lost = _delivery(namespace, "lost")
    f.add(TOPICS.deliveries.base, lost)
    f.add(TOPICS.outcomes.base, make_outcome(lost, "delivered", now_ms=T0 + 1))
    assert _write_counts(f) == (0, 0)
    wait_for(f.sink.pending, 10, interval=0.01, what="the row's wait to end")
    f.flush()
    r = _row(settings, lost)
    assert (r["status"], r["attempts"]) == ("delivered", 0)
    f.close()


def test_a_row_produced_before_the_sink_was_given_its_partition_is_never_final(
        settings: Settings, namespace: str) -> None:
    """A delivery dispatched twice (the gate deciding again after a crash, a conversion
    fanned out again) numbers its second round of attempts afresh. Its first round may have
    been stored by an earlier run of the sink, before the row: a row older than the sink's
    assignment is projected, whatever it folded in."""
    d = _delivery(namespace, "twice")
    first = Feed(settings, defer_s=3600)  # the earlier run: the first round, before the row
    first.add(TOPICS.attempts.base, _attempt(d, 1, T0, "timeout"))
    first.add(TOPICS.attempts.base, _attempt(d, 2, T0 + 5000, None))
    first.add(TOPICS.outcomes.base, make_outcome(d, "delivered", now_ms=T0 + 5001,
                                                 attempt_no=2))
    first.flush()
    first.close()
    again = Feed(settings, defer_s=3600, final_from=100)  # restarted; the row is older
    again.add(TOPICS.deliveries.base, d)
    again.add(TOPICS.attempts.base, _attempt(d, 1, T0 + 40_000, None))  # the second round
    again.add(TOPICS.outcomes.base, make_outcome(d, "delivered", now_ms=T0 + 40_001,
                                                 attempt_no=1))
    again.flush()
    r = _row(settings, d)
    assert (r["status"], r["attempts"], r["error"]) == ("delivered", 2, None)
    again.close()


def test_a_row_read_after_an_attempt_of_its_delivery_is_never_final(
        settings: Settings, namespace: str) -> None:
    """The same, within one run: the first round's attempts were read before the row."""
    d = _delivery(namespace, "after")
    f = Feed(settings, defer_s=3600)
    f.add(TOPICS.attempts.base, _attempt(d, 1, T0, "timeout"))
    f.add(TOPICS.attempts.base, _attempt(d, 2, T0 + 5000, "timeout"))
    f.flush()
    f.add(TOPICS.deliveries.base, d)
    f.add(TOPICS.attempts.base, _attempt(d, 1, T0 + 40_000, None))
    f.add(TOPICS.outcomes.base, make_outcome(d, "delivered", now_ms=T0 + 40_001,
                                             attempt_no=1))
    f.flush()
    r = _row(settings, d)
    assert (r["status"], r["attempts"], r["error"]) == ("delivered", 2, "timeout")
    f.close()


def test_rows_may_be_final_from_the_end_of_the_partition_when_the_sink_was_given_it(
        settings: Settings, namespace: str) -> None:
    from confluent_kafka import Producer

    from postbacks.kafka.clients import make_consumer

    topic = settings.topic(TOPICS.deliveries.base)
    p = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    for _ in range(3):
        p.produce(topic, b"x", b"k", partition=0)
    assert p.flush(30) == 0
    attempts, outcomes = (settings.topic(t.base) for t in (TOPICS.attempts, TOPICS.outcomes))
    sink = PostgresSink(settings)
    consumer = make_consumer(settings, "final-from-test")
    try:
        given = [TopicPartition(t, p) for t in (topic, attempts, outcomes) for p in (0, 1, 2)]
        # partition 2's outcomes went to another sink: none of its rows is final here
        sink.new_rows_from(consumer, given[:-1])
        assert sink._waiting._final_from == {(topic, 0): 3, (topic, 1): 0}
        sink.new_rows_from(consumer, [TopicPartition(t, 999)  # no such partition
                                      for t in (topic, attempts, outcomes)])
        assert (topic, 999) not in sink._waiting._final_from
        sink.forget([TopicPartition(topic, 0)])
        assert sink._waiting._final_from == {(topic, 1): 0}
    finally:
        consumer.close()
        sink.close()


@pytest.mark.parametrize(("seed", "defer_max"), [(1, 1000), (2, 1000), (3, 1000), (4, 3)])
def test_rows_written_settled_match_the_projection_in_any_arrival_order(
        settings: Settings, namespace: str, seed: int, defer_max: int) -> None:
    """Deliveries (some published twice), their attempts and outcomes read in a random
    order, flushed at random points, rows waiting or spilled pending: at the end the
    projection statement over every delivery finds nothing to change."""
    rng = random.Random(seed)
    f = Feed(settings, defer_s=3600, defer_max=defer_max)
    records: list[tuple[float, str, Any]] = []
    want: dict[str, tuple[str, int]] = {}
    for n in range(60):
        d = _delivery(namespace, f"r{seed}_{n}")
        # in the order they are produced, each read a little early or late: the three
        # topics are read side by side, so an attempt or an outcome can come before its
        # row, an outcome before its attempt
        at = n * 10.0
        records.append((at + rng.gauss(0, 4), TOPICS.deliveries.base, d))
        if rng.random() < 0.2:  # published twice
            records.append((at + rng.uniform(0, 12), TOPICS.deliveries.base,
                            {**d, "created_at": d["created_at"] + 1}))
        tries = rng.choice([0, 1, 1, 2, 3])
        status = "pending"
        for no in range(1, tries + 1):
            last = no == tries and rng.random() < 0.8
            status = "delivered" if last else "failing"
            ms = T0 + no * 1000
            records.append((at + no * 3 + rng.gauss(0, 4), TOPICS.attempts.base,
                            _attempt(d, no, ms, None if last else "timeout")))
            records.append((at + no * 3 + 1 + rng.gauss(0, 4), TOPICS.outcomes.base,
                            make_outcome(d, status, now_ms=ms + 1, attempt_no=no)))
        want[d["delivery_id"]] = (status, tries)
    records.sort(key=lambda r: r[0])
    for _at, topic, value in records:
        f.add(topic, value)
        if rng.random() < 0.05:
            f.flush()
    f.flush(everything=True)
    from sinks.projection import PROJECT

    with connect(settings.database_url) as conn:
        changed = conn.execute(PROJECT, {"ids": list(want)}).rowcount
        conn.rollback()
        got = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT delivery_id, status, attempt_count FROM deliveries"
            " WHERE delivery_id = ANY(%s)", (list(want),))}
    assert changed == 0
    assert got == want
    f.close()


def test_a_batch_meeting_a_stored_row_keeps_the_rest_and_stores_it_once(
        settings: Settings, namespace: str) -> None:
    """Rows are copied straight into their table; one already stored fails that copy, and
    the batch goes in through the staging table, skipping only the stored row."""
    f = Feed(settings)
    ds = [_delivery(namespace, f"b{i}") for i in range(3)]
    outs = [make_outcome(d, "failing", now_ms=T0 + i) for i, d in enumerate(ds)]
    f.add(TOPICS.outcomes.base, outs[1])
    f.flush()
    for o in outs:
        f.add(TOPICS.outcomes.base, o)
    conn = f.sink.conn()
    written = f.sink.flush()
    assert written == {"outcomes": 2}
    with connect(settings.database_url) as c:
        got = c.execute("SELECT outcome_id, count(*) FROM delivery_outcomes"
                        " WHERE outcome_id = ANY(%s) GROUP BY outcome_id",
                        ([o["outcome_id"] for o in outs],)).fetchall()
    assert sorted(got) == sorted((o["outcome_id"], 1) for o in outs)
    assert conn is f.sink.conn() and not conn.closed  # the savepoint went, not the session
    # the next batch goes through staging (rows read again come in runs) ...
    assert f.sink._via_staging == {"outcomes"}
    f.add(TOPICS.outcomes.base, make_outcome(ds[0], "delivered", now_ms=T0 + 9))
    assert f.sink.flush() == {"outcomes": 1}
    # ... and, having met nothing stored, the one after it straight in again
    assert f.sink._via_staging == set()
    f.add(TOPICS.outcomes.base, make_outcome(ds[1], "delivered", now_ms=T0 + 9))
    assert f.sink.flush() == {"outcomes": 1}
    f.close()


def _write_counts(f: Feed) -> tuple[int, int]:
    """Flush inside a transaction of the sink's own connection (``flush`` nests as a
    savepoint) and return this transaction's (inserts, updates) on ``deliveries``."""
    # the view also holds earlier transactions' counts not yet reported (a backend
    # reports them when idle, at most once a second): the difference inside one is exact
    q = ("SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0)"
         " FROM pg_stat_xact_user_tables WHERE relid IN (SELECT inhrelid FROM pg_inherits"
         " WHERE inhparent = 'deliveries'::regclass)")  # its day partitions
    conn = f.sink.conn()
    before = conn.execute(q).fetchone()  # opens the transaction
    f.flush()
    after = conn.execute(q).fetchone()
    conn.commit()
    assert before is not None and after is not None
    return int(after[0]) - int(before[0]), int(after[1]) - int(before[1])


def _stored(settings: Settings, f: Feed, topic_base: str, partition: int = 0) -> int | None:
    with connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT next_offset FROM sink_offsets WHERE consumer_group = %s AND topic = %s"
            " AND kafka_partition = %s",
            (f.sink.group, settings.topic(topic_base), partition)).fetchone()
    return None if row is None else int(row[0])


def _exists(settings: Settings, d: Any) -> bool:
    with connect(settings.database_url) as conn:
        return conn.execute("SELECT 1 FROM deliveries WHERE delivery_id = %s",
                            (d["delivery_id"],)).fetchone() is not None


def test_a_waiting_row_is_inserted_projected_with_its_first_outcome_never_updated(
        settings: Settings, namespace: str) -> None:
    f = Feed(settings, defer_s=3600)
    ok, retried, held, tie = (_delivery(namespace, n) for n in ("ok", "retried", "held", "tie"))
    first_offset = f.add(TOPICS.deliveries.base, ok)
    for d in (retried, held, tie):
        f.add(TOPICS.deliveries.base, d)
    f.add(TOPICS.outcomes.base, make_outcome(_delivery(namespace, "other"), "held", now_ms=T0))
    assert _write_counts(f) == (0, 0)  # no outcome of theirs yet: all four wait
    assert not any(_exists(settings, d) for d in (ok, retried, held, tie))
    assert f.sink.waiting() == 4
    assert _stored(settings, f, TOPICS.deliveries.base) == first_offset  # not past them
    assert _stored(settings, f, TOPICS.outcomes.base) == f.offset + 1

    f.add(TOPICS.attempts.base, _attempt(ok, 1, T0, None))
    f.add(TOPICS.outcomes.base, make_outcome(ok, "delivered", now_ms=T0 + 1))
    f.add(TOPICS.attempts.base, _attempt(retried, 2, T0 + 5000, None))  # out of order
    f.add(TOPICS.attempts.base, _attempt(retried, 1, T0, "http_5xx"))
    f.add(TOPICS.outcomes.base, make_outcome(retried, "delivered", now_ms=T0 + 5001))
    f.add(TOPICS.outcomes.base, make_outcome(retried, "failing", now_ms=T0 + 1))
    f.add(TOPICS.outcomes.base, make_outcome(held, "held", now_ms=T0, reason="value_rate"))
    a = make_outcome(tie, "failing", now_ms=T0)
    b = make_outcome(tie, "delivered", now_ms=T0)
    lo, hi = sorted((a, b), key=lambda o: o["outcome_id"])
    # (with its attempt: a row whose latest outcome is `delivered` waits for that attempt)
    f.add(TOPICS.attempts.base, _attempt(tie, 1, T0, None))
    f.add(TOPICS.outcomes.base, {**hi, "occurred_at": lo["occurred_at"]})
    f.add(TOPICS.outcomes.base, lo)
    assert _write_counts(f) == (4, 0)  # inserted with their status: nothing rewritten
    assert f.sink.waiting() == 0

    assert _stored(settings, f, TOPICS.deliveries.base) == f.offset - 10  # past all four
    assert (_row(settings, ok)["status"], _row(settings, ok)["attempts"]) == ("delivered", 1)
    r = _row(settings, retried)
    assert (r["status"], r["attempts"], r["error"]) == ("delivered", 2, None)
    h = _row(settings, held)
    assert (h["status"], h["reason"], h["held"]) == ("held", "value_rate", True)
    assert _row(settings, tie)["status"] == hi["kind"]
    # an attempt alone (its outcome comes in the next fetch) leaves the row waiting
    late = _delivery(namespace, "late")
    f.add(TOPICS.deliveries.base, late)
    f.add(TOPICS.attempts.base, _attempt(late, 1, T0, "timeout"))
    assert _write_counts(f) == (0, 0)
    f.add(TOPICS.outcomes.base, make_outcome(late, "failing", now_ms=T0 + 1))
    assert _write_counts(f) == (1, 0)
    r = _row(settings, late)
    assert (r["status"], r["attempts"], r["error"]) == ("failing", 1, "timeout")

    # an outcome read before its delivery row: nothing left to wait for, written at once
    early = _delivery(namespace, "early")
    f.add(TOPICS.outcomes.base, make_outcome(early, "delivered", now_ms=T0))
    f.flush()
    f.add(TOPICS.deliveries.base, early)
    f.flush()
    assert _row(settings, early)["status"] == "delivered"
    assert f.sink.waiting() == 0
    f.close()


def test_a_row_without_outcome_is_written_pending_after_defer_s_or_beyond_defer_max(
        settings: Settings, namespace: str) -> None:
    f = Feed(settings, defer_s=3600, defer_max=2)
    a, b, c = (_delivery(namespace, n) for n in ("a", "b", "c"))
    f.add(TOPICS.deliveries.base, a)
    b_offset = f.add(TOPICS.deliveries.base, b)
    f.add(TOPICS.deliveries.base, c)
    assert _write_counts(f) == (1, 0)  # three waiting, two allowed: the oldest goes
    assert _row(settings, a)["status"] == "pending"
    assert not _exists(settings, b) and not _exists(settings, c)
    assert _stored(settings, f, TOPICS.deliveries.base) == b_offset
    f.close()

    f = Feed(settings, defer_s=2.0)
    d = _delivery(namespace, "d")
    f.add(TOPICS.deliveries.base, d)
    assert _write_counts(f) == (0, 0)  # waiting: only its offset's place is stored
    assert f.sink.waiting() == 1 and not f.sink.pending()
    wait_for(f.sink.pending, 10, interval=0.01, what="the row's wait to end")
    assert _write_counts(f) == (1, 0)
    assert _row(settings, d)["status"] == "pending"
    f.close()


def test_a_revoked_partition_forgets_its_waiting_rows_and_stores_no_offset_past_them(
        settings: Settings, namespace: str) -> None:
    f = Feed(settings, defer_s=3600)
    kept, gone = _delivery(namespace, "kept"), _delivery(namespace, "gone")
    f.add(TOPICS.deliveries.base, kept, partition=0)
    f.add(TOPICS.deliveries.base, gone, partition=1)
    f.sink.forget([TopicPartition(settings.topic(TOPICS.deliveries.base), 1)])
    assert f.sink.waiting() == 1
    f.add(TOPICS.outcomes.base, make_outcome(gone, "delivered", now_ms=T0))
    f.flush()
    assert _stored(settings, f, TOPICS.deliveries.base, partition=1) is None
    assert not _exists(settings, gone)  # its new owner writes it
    f.flush(everything=True)  # stopping: whatever waits is written
    assert _row(settings, kept)["status"] == "pending"
    assert f.sink.waiting() == 0
    f.close()


def test_a_row_released_behind_a_waiting_one_and_a_dead_letter_keep_the_offset_honest(
        settings: Settings, namespace: str) -> None:
    f = Feed(settings, defer_s=3600)
    topic = settings.topic(TOPICS.deliveries.base)
    early, later = _delivery(namespace, "early"), _delivery(namespace, "later")
    early_offset = f.add(TOPICS.deliveries.base, early)
    f.add(TOPICS.deliveries.base, later)
    f.add(TOPICS.outcomes.base, make_outcome(later, "held", now_ms=T0))
    f.flush()  # `later` written, `early` still waiting: the stored offset stays at it
    assert _exists(settings, later) and not _exists(settings, early)
    assert _stored(settings, f, TOPICS.deliveries.base) == early_offset

    f.offset += 1
    bad = Message(topic=topic, partition=0, offset=f.offset, key=b"k", value=b"\x00garbage",
                  timestamp=(TIMESTAMP_CREATE_TIME, T0))
    f.sink.add(bad, T0)
    f.flush()  # a dead letter behind the waiting row: read again after a crash ...
    f.sink.add(bad, T0 + 5)
    f.flush()  # ... it meets its first copy
    with connect(settings.database_url) as conn:
        n = conn.execute("SELECT count(*) FROM dead_letters WHERE origin_topic = %s",
                         (topic,)).fetchone()
    assert n == (1,)
    f.add(TOPICS.outcomes.base, make_outcome(early, "held", now_ms=T0))
    f.flush()  # `early` released: the offset moves past the dead letter, not back onto it
    assert _stored(settings, f, TOPICS.deliveries.base) == bad.offset() + 1
    f.close()


def test_outcomes_remembered_with_no_row_waiting_stay_bounded(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting_module, "OUTCOME_FIRST_KEPT", 3)
    f = Feed(settings, defer_s=3600)
    ds = [_delivery(namespace, f"o{i}") for i in range(8)]
    for d in ds:
        f.add(TOPICS.outcomes.base, make_outcome(d, "delivered", now_ms=T0))
    assert f.sink._waiting.remembered() <= 6
    f.add(TOPICS.deliveries.base, ds[-1])  # remembered: written at once
    f.add(TOPICS.deliveries.base, ds[0])  # forgotten: waits
    assert f.sink.waiting() == 1
    f.close()


def test_once_an_attempt_read_before_its_row_is_forgotten_no_row_is_final_until_the_ends_are_read(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids of attempts read with no row waiting are kept in a bounded set; a row read
    after its attempt's id was forgotten could be taken for final, so none is until the
    sink reads its partitions' ends again (rows below them came before the forgetting)."""
    monkeypatch.setattr(waiting_module, "OUTCOME_FIRST_KEPT", 3)
    calls = _projected(monkeypatch)
    f = Feed(settings, defer_s=3600)
    early = [_delivery(namespace, f"a{i}") for i in range(7)]
    for d in early:
        f.add(TOPICS.attempts.base, _attempt(d, 1, T0, "timeout"))
    assert f.sink.ends_wanted()
    assert early[0]["delivery_id"] not in f.sink._waiting._attempt_first  # forgotten

    def deliver(d: Any) -> None:
        f.add(TOPICS.deliveries.base, d)
        f.add(TOPICS.attempts.base, _attempt(d, 1, T0 + 40_000, None))
        f.add(TOPICS.outcomes.base, make_outcome(d, "delivered", now_ms=T0 + 40_001,
                                                 attempt_no=1))
        calls.clear()
        f.flush()

    deliver(early[0])  # its first attempt is forgotten: projected, counted right
    assert early[0]["delivery_id"] in [i for c in calls for i in c]
    r = _row(settings, early[0])
    assert (r["status"], r["attempts"]) == ("delivered", 1)
    from postbacks.kafka.clients import make_consumer

    consumer = make_consumer(settings, "ends-again-test")  # what run_sink does when wanted
    try:
        f.sink.new_rows_from(consumer, [TopicPartition(settings.topic(t.base), p)
                                        for t in (TOPICS.deliveries, TOPICS.attempts,
                                                  TOPICS.outcomes) for p in (0, 1)])
    finally:
        consumer.close()
    assert not f.sink.ends_wanted()
    later = _delivery(namespace, "later")
    deliver(later)
    assert later["delivery_id"] not in [i for c in calls for i in c]  # final again
    f.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_interleavings_never_store_an_offset_past_an_unwritten_row(
        settings: Settings, namespace: str, seed: int) -> None:
    """Deliveries on two partitions and their outcomes, read in a random order with
    flushes, crashes (discard, then read again from the stored offsets) and revocations
    (forget, then read again): after every flush, every delivery below a partition's stored
    offset is in PostgreSQL; at the end every one is, delivered when it had an outcome."""
    rng = random.Random(seed)
    f = Feed(settings, defer_s=3600, defer_max=rng.choice([3, 1000]))
    dtopic, otopic = (settings.topic(t) for t in (TOPICS.deliveries.base,
                                                  TOPICS.outcomes.base))
    logs: dict[str, list[Any]] = {f"{dtopic}/0": [], f"{dtopic}/1": [], f"{otopic}/0": []}
    read: dict[str, int] = dict.fromkeys(logs, 0)  # each partition's consumer position

    revoked: set[str] = set()  # owned by another consumer for now

    def consume(name: str) -> None:
        topic, partition = name.rsplit("/", 1)
        while name not in revoked and read[name] < len(logs[name]):
            f.sink.add_record(topic, int(partition), read[name], logs[name][read[name]])
            read[name] += 1

    def rewind(name: str) -> None:
        topic, partition = name.rsplit("/", 1)
        read[name] = _stored_at(settings, f, topic, int(partition)) or 0
        consume(name)

    answered: set[str] = set()
    for step in range(250):
        action = rng.random()
        if action < 0.4:
            name = f"{dtopic}/{rng.randrange(2)}"
            logs[name].append(_delivery(namespace, f"s{seed}_{step}"))
            consume(name)
        elif action < 0.7:
            seen = [d for n in logs if n.startswith(dtopic) for d in logs[n][:read[n]]]
            if seen:
                d = rng.choice(seen)
                logs[f"{otopic}/0"].append(make_outcome(d, "delivered", now_ms=T0 + step))
                answered.add(d["delivery_id"])
                consume(f"{otopic}/0")
        elif action < 0.85:
            f.flush()
            for name in (f"{dtopic}/0", f"{dtopic}/1"):
                stored = _stored_at(settings, f, dtopic, int(name[-1])) or 0
                ids = [d["delivery_id"] for d in logs[name][:stored]]
                with connect(settings.database_url) as conn:
                    there = {r[0] for r in conn.execute(
                        "SELECT delivery_id FROM deliveries WHERE delivery_id = ANY(%s)",
                        (ids,))}
                missing = [i for i in ids if i not in there]
                assert not missing, f"step {step}: stored offset {stored} passes {missing}"
        elif action < 0.91:  # a failed flush: everything not written goes, read again
            f.sink.discard()
            for name in logs:
                rewind(name)
        elif action < 0.96:  # a partition revoked (flushes go on without it) ...
            p = rng.randrange(2)
            f.sink.forget([TopicPartition(dtopic, p)])
            revoked.add(f"{dtopic}/{p}")
        elif revoked:  # ... and assigned again
            name = revoked.pop()
            rewind(name)
    while revoked:
        rewind(revoked.pop())
    f.flush(everything=True)
    for name in (f"{dtopic}/0", f"{dtopic}/1"):
        for d in logs[name]:
            want = "delivered" if d["delivery_id"] in answered else "pending"
            assert _row(settings, d)["status"] == want
    f.close()


def _stored_at(settings: Settings, f: Feed, topic: str, partition: int) -> int | None:
    with connect(settings.database_url) as conn:
        row = conn.execute(
            "SELECT next_offset FROM sink_offsets WHERE consumer_group = %s AND topic = %s"
            " AND kafka_partition = %s", (f.sink.group, topic, partition)).fetchone()
    return None if row is None else int(row[0])
