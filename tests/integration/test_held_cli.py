"""`postbacks held list | release | reject` against the real broker and database, and the
publisher-scoped query that never shows held or rejected deliveries.

Held deliveries are inserted straight into PostgreSQL (as the sink projects them) with ids
carrying the test's namespace; the database is shared, so every query filters by it.
"""

from __future__ import annotations

import json
import time

import pytest

from postbacks.db.anomaly import held_deliveries, publisher_deliveries
from postbacks.db.connect import connect
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import (
    audit_rows,
    held_delivery,
    insert_deliveries,
    run_cli,
    topic_size,
)
from tests.kafka_util import decode, read_topic
from topics import TOPICS

RETRY_5S = TOPICS.retry_tier("5s").base


def _no_retry_records(settings: Settings) -> None:
    for spec in TOPICS.retry:
        assert topic_size(settings, spec.base) == 0, spec.base


def test_list_filters_by_endpoint_reason_and_app(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ep_a, ep_b = f"ep_{namespace}_a", f"ep_{namespace}_b"
    insert_deliveries(settings, [held_delivery(namespace, i, endpoint=ep_a) for i in (1, 2)])
    insert_deliveries(settings, [held_delivery(namespace, 3, endpoint=ep_b,
                                               app=f"app_{namespace}_other")],
                      reason="halted_endpoint")
    insert_deliveries(settings, [held_delivery(namespace, 4, endpoint=ep_a)], status="pending")

    assert run_cli(monkeypatch, settings, "held", "list", "--endpoint", ep_a, "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["delivery_id"] for r in rows) == [f"dlv_{namespace}_1", f"dlv_{namespace}_2"]
    assert all(r["hold_reason"] == "retrodated" and r["snapshot"]["app_id"] == f"app_{namespace}"
               for r in rows)

    assert run_cli(monkeypatch, settings, "held", "list", "--app", f"app_{namespace}_other",
                   "--reason", "halted_endpoint", "--json") == 0
    assert [r["delivery_id"] for r in json.loads(capsys.readouterr().out)] == [
        f"dlv_{namespace}_3"]

    assert run_cli(monkeypatch, settings, "held", "list", "--endpoint", ep_b) == 0
    out = capsys.readouterr().out
    assert f"dlv_{namespace}_3" in out and "halted_endpoint" in out and "1 held" in out


def test_release_republishes_with_original_identity_in_one_transaction(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ep = f"ep_{namespace}_r"
    held = [held_delivery(namespace, 1, endpoint=ep),
            held_delivery(namespace, 2, endpoint=ep, attempt=2)]
    insert_deliveries(settings, held)
    ids = [d["delivery_id"] for d in held]
    before = int(time.time() * 1000)

    code = run_cli(monkeypatch, settings, "held", "release", "--delivery-id", *ids,
                   "--actor", "alice", "--note", "false positive")
    assert code == 0, capsys.readouterr().err
    assert "released 2 held deliveries" in capsys.readouterr().out

    by_id = {d["delivery_id"]: d for d in held}
    msgs = read_topic(settings, RETRY_5S, 2)
    assert len(msgs) == 2
    for m in msgs:
        r = decode("Delivery", m)
        orig = by_id[r["delivery_id"]]
        assert m.key() == ep.encode()
        assert r["idempotency_key"] == orig["idempotency_key"]
        assert r["conversion"] == orig["conversion"]
        assert (r["trigger"], r["triggered_by"], r["hold_reason"]) == ("release", "cli:alice", None)
        assert r["attempt"] == orig["attempt"] and r["enqueued_at"] is None
        assert r["due_at"] is not None and before <= r["due_at"] <= int(time.time() * 1000)
    outs = [decode("Outcome", m) for m in read_topic(settings, TOPICS.outcomes.base, 2)]
    assert sorted(o["delivery_id"] for o in outs) == sorted(ids)
    assert {(o["kind"], o["actor"], o["reason"]) for o in outs} == {
        ("released", "cli:alice", "released by cli:alice: false positive")}
    assert {o["idempotency_key"] for o in outs} == {d["idempotency_key"] for d in held}
    # Transactional: each partition written holds a commit marker after the records.
    assert topic_size(settings, RETRY_5S) == 3 and topic_size(settings, TOPICS.outcomes.base) == 3

    audits = audit_rows(settings, ids)
    assert [(a["action"], a["actor"], a["target_type"], a["note"]) for a in audits] == [
        ("held.release", "cli:alice", "delivery", "false positive")] * 2
    assert all(a["before"] == {"status": "held", "hold_reason": "retrodated"}
               and a["after"] == {"status": "released", "triggered_by": "cli:alice"}
               for a in audits)

    # Resolved (even before the sink projects the outcome): never released twice.
    with connect(settings.database_url) as conn:
        assert held_deliveries(conn, endpoint_id=ep) == []
    assert run_cli(monkeypatch, settings, "held", "release", "--delivery-id", ids[0],
                   "--actor", "alice") == 1
    assert "not held" in capsys.readouterr().err
    assert topic_size(settings, RETRY_5S) == 3 and len(audit_rows(settings, ids)) == 2


def test_reject_publishes_rejected_outcome_and_nothing_to_retry(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ep = f"ep_{namespace}_x"
    held = [held_delivery(namespace, i, endpoint=ep) for i in (1, 2, 3)]
    insert_deliveries(settings, held, reason="payout_rate_endpoint")

    code = run_cli(monkeypatch, settings, "held", "reject", "--endpoint", ep,
                   "--reason", "payout_rate_endpoint", "--actor", "bob", "--note", "fraud")
    assert code == 0, capsys.readouterr().err
    outs = [decode("Outcome", m) for m in read_topic(settings, TOPICS.outcomes.base, 3)]
    assert sorted(o["delivery_id"] for o in outs) == sorted(d["delivery_id"] for d in held)
    assert {(o["kind"], o["actor"], o["reason"], o["payout_usd_micros"]) for o in outs} == {
        ("rejected", "cli:bob", "rejected by cli:bob: fraud", None)}
    _no_retry_records(settings)
    audits = audit_rows(settings, [d["delivery_id"] for d in held])
    assert len(audits) == 3 and {a["action"] for a in audits} == {"held.reject"}
    assert audits[0]["after"] == {"status": "rejected", "reason": "rejected by cli:bob: fraud"}


def test_more_than_100_needs_confirmation(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ep = f"ep_{namespace}_big"
    held = [held_delivery(namespace, i, endpoint=ep) for i in range(101)]
    insert_deliveries(settings, held)
    ids = [d["delivery_id"] for d in held]

    assert run_cli(monkeypatch, settings, "held", "release", "--endpoint", ep,
                   "--actor", "carol") == 1
    assert "101 held deliveries would be released" in capsys.readouterr().err
    assert topic_size(settings, RETRY_5S) == 0
    assert topic_size(settings, TOPICS.outcomes.base) == 0
    assert audit_rows(settings, ids) == []

    assert run_cli(monkeypatch, settings, "held", "release", "--endpoint", ep,
                   "--actor", "carol", "--yes") == 0
    assert len(read_topic(settings, RETRY_5S, 101)) == 101
    assert len(audit_rows(settings, ids)) == 101


def test_unknown_delivery_id_publishes_nothing(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = held_delivery(namespace, 1, endpoint=f"ep_{namespace}_u")
    insert_deliveries(settings, [d])
    unknown = f"dlv_{namespace}_nope"
    assert run_cli(monkeypatch, settings, "held", "release", "--delivery-id",
                   d["delivery_id"], unknown, "--actor", "dave") == 1
    err = capsys.readouterr().err
    assert unknown in err and "nothing was released" in err and "Traceback" not in err
    assert err.count("\n") == 1
    assert topic_size(settings, RETRY_5S) == 0 and topic_size(settings, TOPICS.outcomes.base) == 0
    assert audit_rows(settings, [d["delivery_id"]]) == []


def test_the_audit_failing_publishes_nothing(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The audit rows are what keep a delivery from being released twice; they are written
    before the publish. PostgreSQL failing on them (here: made to) publishes nothing, so a
    retry does not release the same deliveries a second time."""
    import psycopg

    import postbacks.db.anomaly as anomaly
    from replay_console.held import resolve_held

    d = held_delivery(namespace, 1, endpoint=f"ep_{namespace}_f")
    insert_deliveries(settings, [d])

    def broken(*_a: object, **_k: object) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(anomaly, "audit_held", broken)
    with pytest.raises(psycopg.OperationalError):
        resolve_held(settings, kind="released", actor="cli:erin",
                     delivery_ids=[d["delivery_id"]])
    assert topic_size(settings, RETRY_5S) == 0 and topic_size(settings, TOPICS.outcomes.base) == 0
    assert audit_rows(settings, [d["delivery_id"]]) == []


def test_invalid_snapshot_is_a_per_delivery_error(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ep = f"ep_{namespace}_bad"
    good, bad = held_delivery(namespace, 1, endpoint=ep), held_delivery(namespace, 2, endpoint=ep)
    insert_deliveries(settings, [good])
    broken = {k: v for k, v in bad["conversion"].items() if k != "event_id"}
    insert_deliveries(settings, [bad], snapshot=broken)

    assert run_cli(monkeypatch, settings, "held", "release", "--endpoint", ep,
                   "--actor", "erin") == 1
    captured = capsys.readouterr()
    assert bad["delivery_id"] in captured.err and "event_id" in captured.err
    assert "Traceback" not in captured.err and "1 skipped" in captured.out
    msgs = read_topic(settings, RETRY_5S, 1)
    assert [decode("Delivery", m)["delivery_id"] for m in msgs] == [good["delivery_id"]]
    assert [a["target_id"] for a in audit_rows(settings, [good["delivery_id"],
                                                          bad["delivery_id"]])] == [
        good["delivery_id"]]


@pytest.mark.parametrize(("argv", "message"), [
    (["--actor", "x"], "choose what to resolve"),
    (["--all", "--endpoint", "e", "--actor", "x"], "--all cannot be combined"),
    (["--delivery-id", "a", "--reason", "r", "--actor", "x"], "--delivery-id cannot be"),
    (["--endpoint", "e", "--actor", "  "], "--actor must name"),
    (["--endpoint", "e", "--actor", "x\nreviewer:root"], "without control characters"),
])
def test_bad_selection_is_a_usage_error(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str], message: str,
) -> None:
    assert run_cli(monkeypatch, settings, "held", "release", *argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("postbacks held release: error:")


def test_nothing_matched_and_database_down(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(monkeypatch, settings, "held", "reject", "--endpoint", f"ep_{namespace}_0",
                   "--actor", "x") == 1
    assert "no held deliveries match" in capsys.readouterr().err
    down = Settings(kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
                    database_url="postgresql://postbacks@127.0.0.1:1/postbacks",
                    topic_prefix=settings.topic_prefix, instance_id=namespace)
    assert run_cli(monkeypatch, down, "held", "list") == 2
    err = capsys.readouterr().err
    assert "PostgreSQL is not reachable" in err and "Traceback" not in err


def test_publisher_view_never_shows_held_rejected_pending_or_other_apps(
    settings: Settings, namespace: str,
) -> None:
    """``pending`` is hidden too: a delivery the gate holds is pending until the sink
    projects its ``held`` outcome."""
    app, other = f"app_{namespace}", f"app_{namespace}_other"
    ep = f"ep_{namespace}_p"
    shown = {"delivered": 2, "released": 3, "failing": 4}
    insert_deliveries(settings, [held_delivery(namespace, 1, endpoint=ep)], status="pending")
    for status, n in shown.items():
        insert_deliveries(settings, [held_delivery(namespace, n, endpoint=ep)], status=status)
    insert_deliveries(settings, [held_delivery(namespace, 5, endpoint=ep)], status="held")
    insert_deliveries(settings, [held_delivery(namespace, 6, endpoint=ep)], status="rejected")
    insert_deliveries(settings, [held_delivery(namespace, 7, endpoint=f"ep_{namespace}_o",
                                               app=other)], status="delivered")
    with connect(settings.database_url) as conn:
        rows = publisher_deliveries(conn, app_ids=[app])
        assert sorted(r["delivery_id"] for r in rows) == sorted(
            f"dlv_{namespace}_{n}" for n in shown.values())
        assert {r["status"] for r in rows} == set(shown)
        assert all("hold_reason" not in r and r["app_id"] == app for r in rows)
        assert {r["app_id"] for r in publisher_deliveries(conn, app_ids=[other])} == {other}
        assert len(publisher_deliveries(conn, app_ids=[app], limit=2)) == 2
        assert publisher_deliveries(conn, app_ids=[]) == []
