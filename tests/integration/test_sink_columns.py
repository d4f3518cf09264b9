"""Every column the sink writes holds the record's value, read back from PostgreSQL: the
binary COPY (each value sent in PostgreSQL's own binary form, typed from the catalog) for
text, integers, doubles, timestamps, bytea, jsonb and NULL, straight into the tables and
through the staging tables."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Message

from postbacks.codec import codec_for
from postbacks.core.outcomes import make_attempt, make_outcome
from postbacks.core.providers.base import RenderedRequest
from postbacks.db.connect import connect
from postbacks.settings import Settings
from sinks.postgres import PostgresSink
from sinks.tables import TABLES, column_types
from tests.unit.factories import make_conversion, make_delivery
from topics import TOPICS

T0 = 1_750_000_000_123


def _ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _records(ns: str, name: str) -> tuple[Any, Any, Any]:
    conversion = make_conversion(
        conversion_id=f"cv_{ns}_{name}", goal_id=None if name == "direct" else "goal-é",
        payout_usd_micros=9_007_199_254_740_993,  # past a double's exact integers
        source_snapshot={"player": "p\u00e9 \U0001f600", "quote": "a\"b\\c\n\t", "n": "1"})
    d = make_delivery(delivery_id=f"dlv_{ns}_{name}", endpoint_id=f"ep_{ns}",
                      conversion=conversion, created_at=T0)
    req = RenderedRequest("POST", f"https://example.test/{name}?q=\u00e9",
                          {"Content-Type": "application/json", "X-Note": "tab\there"},
                          b"\x00\x01binary\xff body")
    a = make_attempt(d, now_ms=T0 + 1, result="retry", req=req, status=503,
                     error_class="http_5xx", error_message="line one\nline two \\ \u00e9",
                     queue_ms=0.125, platform_ms=1e-9, wire_ms=12345.5,
                     excerpt=b"\r\n\x00\\ end")
    o = make_outcome(d, "failing", now_ms=T0 + 2, reason="503 \u00e9", attempt_no=1)
    return d, a, o


def _fetch(settings: Settings, table: str, cols: tuple[str, ...], key: str,
           value: str) -> tuple[Any, ...]:
    with connect(settings.database_url) as conn:
        row = conn.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE {key} = %s",
                           (value,)).fetchone()
    assert row is not None, f"no {table} row for {value}"
    return tuple(row)


@pytest.mark.parametrize("path", ["direct", "staging"])
def test_every_column_holds_the_records_value(settings: Settings, namespace: str,
                                              path: str) -> None:
    sink = PostgresSink(settings, defer_s=0.0)
    try:
        sink.conn()
        if path == "staging":  # as after a batch that met a stored row
            sink._via_staging = set(TABLES)
        d, a, o = _records(namespace, path)
        topic = settings.topic(TOPICS.deliveries.base)
        sink._waiting.final_from((topic, 0), 0)
        sink.add_record(topic, 0, 1, d)
        sink.add_record(settings.topic(TOPICS.attempts.base), 0, 1, a)
        sink.add_record(settings.topic(TOPICS.outcomes.base), 0, 1, o)
        bad = Message(topic=settings.topic(TOPICS.outcomes.base), partition=0, offset=2,
                      key=b"k\x00", value=b"\x00not avro " + path.encode(),
                      timestamp=(TIMESTAMP_CREATE_TIME, T0))
        sink.add(bad, T0 + 3)
        sink.flush(everything=True)
    finally:
        sink.close()

    c = d["conversion"]
    assert _fetch(settings, "deliveries", TABLES["deliveries"].columns, "delivery_id",
                  d["delivery_id"]) == (
        d["delivery_id"], d["endpoint_id"], c["app_id"], c["conversion_id"], c["event_type"],
        c["goal_id"], c["event_id"], d["idempotency_key"], c["payout_usd_micros"], dict(c),
        _ts(T0),
        # the status projection of its outcome and attempt
        "failing", _ts(T0 + 2), None, None, 1, "http_5xx")
    assert _fetch(settings, "delivery_attempts", TABLES["attempts"].columns, "attempt_id",
                  a["attempt_id"]) == (
        a["attempt_id"], _ts(T0 + 1), d["delivery_id"], d["endpoint_id"],
        d["idempotency_key"], 1, "initial", "retry", 503, "http_5xx",
        "line one\nline two \\ \u00e9", 0.125, 1e-9, 12345.5, "POST",
        f"https://example.test/{path}?q=\u00e9",
        {"Content-Type": "application/json", "X-Note": "tab\there"},
        b"\x00\x01binary\xff body", b"\r\n\x00\\ end")
    assert _fetch(settings, "delivery_outcomes", TABLES["outcomes"].columns, "outcome_id",
                  o["outcome_id"]) == (
        o["outcome_id"], d["delivery_id"], d["endpoint_id"], c["app_id"], "failing", 1, None,
        "503 \u00e9", None, _ts(T0 + 2))
    with connect(settings.database_url) as conn:
        dead = conn.execute(
            "SELECT stage, origin_topic, origin_partition, origin_offset, original_key,"
            " original_value, delivery_id, occurred_at FROM dead_letters"
            " WHERE origin_topic = %s", (bad.topic(),)).fetchall()
    assert dead == [("sink", bad.topic(), 0, 2, b"k\x00", bad.value(), None, _ts(T0 + 3))]


def test_a_table_missing_a_column_is_named_before_any_row(settings: Settings) -> None:
    with connect(settings.database_url) as conn:
        conn.execute("CREATE TEMP TABLE deliveries (delivery_id text)")  # shadows the table
        with pytest.raises(RuntimeError, match=r"table deliveries has no column\(s\) "
                                               r"endpoint_id, app_id.*postbacks migrate"):
            column_types(conn)


def test_a_column_of_another_type_is_named_before_any_row(settings: Settings) -> None:
    """Binary COPY sends each value in the column's own form: an int4 column widened to
    int8 by a later migration would otherwise fail every flush."""
    with connect(settings.database_url) as conn:
        conn.execute("CREATE TEMP TABLE deliveries (LIKE public.deliveries)")  # shadows it
        conn.execute("ALTER TABLE pg_temp.deliveries ALTER COLUMN attempt_count TYPE bigint")
        with pytest.raises(RuntimeError, match=r"column deliveries.attempt_count is int8 in the"
                                               r" database; the sink writes int4"):
            column_types(conn)


def test_a_value_no_column_can_hold_is_dead_lettered_and_the_partition_moves_on(
        settings: Settings, namespace: str) -> None:
    """A created_at past the year 9999 is a valid Avro long but no timestamp: the record is
    dead-lettered (a sink failing on it would fail again after every restart)."""
    d, _, _ = _records(namespace, "far")
    d["created_at"] = 1 << 62
    topic = settings.topic(TOPICS.deliveries.base)
    far = Message(topic=topic, partition=0, offset=5, key=b"k",
                  value=codec_for("Delivery").encode(d), timestamp=(TIMESTAMP_CREATE_TIME, T0))
    sink = PostgresSink(settings, defer_s=0.0)
    try:
        sink._waiting.final_from((topic, 0), 0)
        sink.add(far, T0)
        sink.flush(everything=True)
        with connect(settings.database_url) as conn:
            dead = conn.execute("SELECT reason, error_message FROM dead_letters"
                                " WHERE origin_topic = %s AND origin_offset = 5",
                                (topic,)).fetchall()
            stored = conn.execute("SELECT next_offset FROM sink_offsets WHERE consumer_group"
                                  " = %s AND topic = %s", (sink.group, topic)).fetchone()
            row = conn.execute("SELECT 1 FROM deliveries WHERE delivery_id = %s",
                               (d["delivery_id"],)).fetchone()
    finally:
        sink.close()
    assert len(dead) == 1 and dead[0][0] == "invalid_record"
    assert "deliveries: a value the table cannot hold" in dead[0][1]
    assert stored == (6,) and row is None
