"""The sink's status projection on ``deliveries``, against PostgreSQL: the latest outcome
decides the status whatever order records arrive in, the attempt count never goes down,
held and suppressed outcomes fill their columns and table, and a touched delivery whose
projection did not change is not rewritten."""

from __future__ import annotations

from typing import Any

from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.sinks.postgres import PostgresSink
from postbacks.topics import TOPICS
from tests.unit.factories import make_conversion, make_delivery

T0 = 1_750_000_000_000


class Feed:
    """Decoded records into a real sink (offsets are irrelevant here), flushed on demand."""

    def __init__(self, settings: Settings) -> None:
        self.sink = PostgresSink(settings)
        self.settings = settings
        self.offset = 0

    def add(self, topic_base: str, value: Any) -> None:
        self.offset += 1
        self.sink.add_record(self.settings.topic(topic_base), 0, self.offset, value)

    def flush(self) -> None:
        self.sink.flush()

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
