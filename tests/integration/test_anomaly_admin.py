"""Anomaly modes and durable halts in PostgreSQL (postbacks/db/anomaly.py) and the
`postbacks anomaly status | set-mode | close` commands, against the real services.

The settings table is shared with every other test (and the gate reads it): these tests
only write endpoint-scope rows whose keys carry the test's namespace, never the global row.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from postbacks.db import anomaly as db
from postbacks.db.connect import connect
from postbacks.errors import ServiceUnavailable
from postbacks.settings import Settings
from streams.anomaly_gate import admin as anomaly_admin
from tests.integration.anomaly_helpers import audit_rows, run_cli, topic_size
from tests.kafka_util import decode, read_topic
from topics import TOPICS

CONTROL = TOPICS.anomaly_control.base
# BreakerState v2's endpoint-breaker fields: unset on an anomaly halt's record
NO_CIRCUIT = {"opened_at": None, "ramp_started_at": None, "consecutive_failures": None}


def _row(settings: Settings, key: str, detector: str = "value_rate",
         scope: str = "endpoint") -> db.AnomalyRow | None:
    with connect(settings.database_url) as conn:
        rows = [r for r in db.load_rows(conn)
                if (r.scope, r.scope_key, r.detector) == (scope, key, detector)]
    return rows[0] if rows else None


def _trip(settings: Settings, key: str, **kw: Any) -> bool:
    with connect(settings.database_url) as conn:
        return db.record_trip(conn, scope="endpoint", scope_key=key, detector="value_rate",
                              reason=kw.get("reason", "payout 5x baseline"), observed=9e8,
                              baseline=1.5e8, at_ms=kw.get("at_ms", 1_772_409_600_000))


@pytest.mark.parametrize(("over", "message"), [
    ({"scope": "tenant"}, "unknown scope 'tenant'"),
    ({"scope": "global", "scope_key": ""}, "the global scope needs a key"),
    ({"scope_key": " "}, "the endpoint scope needs a key"),
    ({"detector": "payout_rate"}, "unknown detector 'payout_rate'"),
    ({"mode": "on"}, "unknown mode 'on'"),
    ({"params": {"threshold": 2}}, "unknown param 'threshold'"),
    ({"params": {"window_ms": 1000}}, "configures retrodating, not value_rate"),
    ({"params": {"multiple": 0}}, "multiple must be a finite number >= 1"),
    ({"params": {"multiple": 0.9}}, "multiple must be a finite number >= 1"),
    ({"params": {"multiple": float("nan")}}, "multiple must be a finite number >= 1"),
    ({"params": {"multiple": True}}, "must be a number"),
    ({"params": {"h": -3.0}}, "h must be a finite number > 0"),
    ({"params": {"h": float("inf")}}, "h must be a finite number > 0"),
    ({"params": {"floor_micros": -1}}, "floor_micros must be >= 0"),
    ({"params": {"floor_micros": 1.5}}, "must be an integer"),
    ({"params": {"floor_micros": "5"}}, "must be a number"),
    ({"detector": "retrodating", "params": {"window_ms": 0}}, "window_ms must be > 0"),
    ({"detector": "retrodating", "params": {"burst_count": -1}}, "burst_count must be 0"),
    ({"detector": "retrodating", "params": {"burst_count": 2.5}}, "must be an integer"),
    ({"params": {"burst_count": 50}}, "configures retrodating, not value_rate"),
    ({"actor": ""}, "an actor is required"),
])
def test_set_mode_validation(settings: Settings, namespace: str, over: dict[str, Any],
                             message: str) -> None:
    key = f"ep_{namespace}"
    args: dict[str, Any] = dict(scope="endpoint", scope_key=key, detector="value_rate",
                                mode="enforce", params=None, actor="alice")
    args.update(over)
    with connect(settings.database_url) as conn, pytest.raises(ValueError, match=message):
        db.set_mode(conn, **args)
    assert _row(settings, key) is None and _row(settings, key, "retrodating") is None
    assert audit_rows(settings, [f"endpoint/{key}/value_rate"]) == []


def test_set_mode_upserts_merges_params_audits_and_keeps_state(
    settings: Settings, namespace: str,
) -> None:
    key = f"ep_{namespace}"
    with connect(settings.database_url) as conn:
        r1 = db.set_mode(conn, scope="endpoint", scope_key=key, detector="value_rate",
                         mode="detect", params={"multiple": 3}, actor="alice", note="calibrated")
    assert (r1.mode, r1.params, r1.state) == ("detect", {"multiple": 3.0}, "closed")
    assert _trip(settings, key)
    with connect(settings.database_url) as conn:
        r2 = db.set_mode(conn, scope="endpoint", scope_key=key, detector="value_rate",
                         mode="enforce", params={"floor_micros": 250_000_000}, actor="bob")
        r3 = db.set_mode(conn, scope="endpoint", scope_key=key, detector="value_rate",
                         mode="off", actor="bob")
    assert r2.params == {"multiple": 3.0, "floor_micros": 250_000_000}
    assert (r2.mode, r2.state, r3.mode, r3.state, r3.params) == (
        "enforce", "tripped", "off", "tripped", r2.params)  # never changes the halt state
    audits = [a for a in audit_rows(settings, [r1.target_id])
              if a["action"] == "anomaly.set_mode"]
    assert [(a["actor"], a["note"]) for a in audits] == [
        ("alice", "calibrated"), ("bob", None), ("bob", None)]
    assert audits[0]["before"] is None and audits[0]["after"]["mode"] == "detect"
    assert audits[1]["before"]["mode"] == "detect" and audits[1]["after"]["mode"] == "enforce"


def test_trip_is_idempotent_audited_and_keeps_the_mode(settings: Settings, namespace: str) -> None:
    key, fresh = f"ep_{namespace}", f"ep_{namespace}_new"
    with connect(settings.database_url) as conn:
        db.set_mode(conn, scope="endpoint", scope_key=key, detector="value_rate",
                    mode="enforce", actor="alice")
    assert _trip(settings, key, at_ms=1_772_409_600_000) is True
    assert _trip(settings, key, at_ms=1_772_409_700_000, reason="again") is False
    row = _row(settings, key)
    assert row is not None
    assert (row.mode, row.state, row.state_reason, row.state_changed_at_ms) == (
        "enforce", "tripped", "payout 5x baseline", 1_772_409_600_000)
    trips = [a for a in audit_rows(settings, [row.target_id]) if a["action"] == "anomaly.trip"]
    assert len(trips) == 1 and trips[0]["actor"] == "system:anomaly-gate"
    assert trips[0]["before"]["state"] == "closed" and trips[0]["after"]["state"] == "tripped"
    assert (trips[0]["after"]["observed"], trips[0]["after"]["baseline"]) == (9e8, 1.5e8)

    assert _trip(settings, fresh) is True  # no row yet: created with mode off
    created = _row(settings, fresh)
    assert created is not None and (created.mode, created.state) == ("off", "tripped")


def test_close_only_when_tripped_by_a_person_and_audited(
    settings: Settings, namespace: str,
) -> None:
    key = f"ep_{namespace}"
    target = dict(scope="endpoint", scope_key=key, detector="value_rate")
    with connect(settings.database_url) as conn:
        with pytest.raises(db.NotTripped, match="not tripped \\(no settings row\\)"):
            db.close_halt(conn, **target, actor="alice", note="ok")
        db.set_mode(conn, **target, mode="enforce", actor="alice")
        with pytest.raises(db.NotTripped, match="not tripped \\(state closed\\)"):
            db.close_halt(conn, **target, actor="alice", note="ok")
    assert _trip(settings, key)
    with connect(settings.database_url) as conn:
        for actor in ("system:anomaly-gate", "SYSTEM:timer"):
            with pytest.raises(ValueError, match="closed by a person") as exc:
                db.close_halt(conn, **target, actor=actor, note="auto")
            assert not isinstance(exc.value, db.NotTripped)
        with pytest.raises(ValueError, match="an actor is required"):
            db.close_halt(conn, **target, actor=" ", note="ok")
        with pytest.raises(ValueError, match="a note is required"):
            db.close_halt(conn, **target, actor="alice", note="")
        assert _row(settings, key).state == "tripped"  # type: ignore[union-attr]
        row = db.close_halt(conn, **target, actor="alice", note="refund batch verified")
        with pytest.raises(db.NotTripped):
            db.close_halt(conn, **target, actor="alice", note="twice")
    assert (row.state, row.mode) == ("closed", "enforce")
    assert row.state_reason == "closed by alice: refund batch verified"
    closes = [a for a in audit_rows(settings, [row.target_id]) if a["action"] == "anomaly.close"]
    assert len(closes) == 1
    assert (closes[0]["actor"], closes[0]["note"]) == ("alice", "refund batch verified")
    assert closes[0]["before"]["state"] == "tripped" and closes[0]["after"]["state"] == "closed"


def test_cli_close_publishes_a_closed_breaker_state(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = f"ep_{namespace}"
    assert _trip(settings, key)
    code = run_cli(monkeypatch, settings, "anomaly", "close", "--scope", "endpoint",
                   "--key", key, "--detector", "value_rate", "--actor", "alice",
                   "--note", "checked with the advertiser")
    assert code == 0, capsys.readouterr().err
    row = _row(settings, key)
    assert row is not None and row.state == "closed"
    [msg] = read_topic(settings, CONTROL, 1)
    assert msg.key() == f"endpoint/{key}/value_rate".encode()
    rec = decode("BreakerState", msg)
    assert rec == {
        "scope": "endpoint", "scope_key": key, "detector": "value_rate", "state": "closed",
        "changed_at": row.state_changed_at_ms, "reason": row.state_reason, "actor": "alice",
        "observed_value": None, "baseline_value": None, **NO_CIRCUIT,
    }
    # Not tripped any more: a clear error, nothing published.
    assert run_cli(monkeypatch, settings, "anomaly", "close", "--scope", "endpoint",
                   "--key", key, "--detector", "value_rate", "--actor", "alice",
                   "--note", "again") == 1
    err = capsys.readouterr().err
    assert "is not tripped (state closed)" in err and "Traceback" not in err
    assert topic_size(settings, CONTROL) == 1
    # A trip older than the close (a stale record replayed from the control topic) does
    # not undo the human's decision; a newer one trips again.
    assert not _trip(settings, key)
    assert _trip(settings, key, at_ms=int(time.time() * 1000) + 1000)
    # A system actor is refused at the command line too.
    assert run_cli(monkeypatch, settings, "anomaly", "close", "--scope", "endpoint",
                   "--key", key, "--detector", "value_rate", "--actor", "system:cron",
                   "--note", "x") == 2
    assert "closed by a person" in capsys.readouterr().err


def test_cli_close_rolls_back_when_the_control_topic_does_not_ack(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = f"ep_{namespace}"
    assert _trip(settings, key)

    def unacked(*_a: Any, **_k: Any) -> None:
        raise ServiceUnavailable("Kafka did not acknowledge 1 of 1 record(s)")

    monkeypatch.setattr(anomaly_admin, "publish_state", unacked)
    assert run_cli(monkeypatch, settings, "anomaly", "close", "--scope", "endpoint",
                   "--key", key, "--detector", "value_rate", "--actor", "alice",
                   "--note", "x") == 2
    err = capsys.readouterr().err
    assert "the halt stays tripped" in err and "Traceback" not in err
    row = _row(settings, key)
    assert row is not None and row.state == "tripped"
    assert not [a for a in audit_rows(settings, [row.target_id]) if a["action"] == "anomaly.close"]


def test_publish_state_for_the_gate(settings: Settings, namespace: str) -> None:
    key = f"ep_{namespace}"
    rec = anomaly_admin.publish_state(
        settings, {"scope": "endpoint", "scope_key": key, "detector": "value_rate",
                   "state": "tripped", "changed_at": 1_772_409_600_000,
                   "reason": "payout_rate_endpoint"},
        observed=9e8, baseline=1.5e8,
    )
    assert _trip(settings, key)
    row = _row(settings, key)
    assert row is not None
    anomaly_admin.publish_state(settings, row, observed=1.0, baseline=2.0)
    msgs = read_topic(settings, CONTROL, 2)
    got = [decode("BreakerState", m) for m in msgs]
    assert got[0] == {**rec, "actor": None, "observed_value": 9e8, "baseline_value": 1.5e8,
                      **NO_CIRCUIT}
    assert (got[1]["state"], got[1]["changed_at"], got[1]["reason"], got[1]["actor"]) == (
        "tripped", row.state_changed_at_ms, row.state_reason, None)
    assert {m.key() for m in msgs} == {f"endpoint/{key}/value_rate".encode()}


def test_the_gate_refuses_a_control_state_dated_ahead(settings: Settings, namespace: str) -> None:
    """A "closed" dated 2**62 on the control topic (anyone with produce rights) used to beat
    every later trip, switching the scope's halts off for good; a gate reading the topic
    refuses it, and the real trip after it holds. Read again at a gate's start, a refusal a
    later change of its key replaced is not counted again (PostbacksControlRefused used to
    fire after every gate restart until compaction removed it); one still current is."""
    import asyncio
    import time

    from prometheus_client import REGISTRY

    from streams.anomaly_gate.config import HaltBook
    from streams.anomaly_gate.control import ControlReader, TripWriter

    key = f"ep_{namespace}"
    now = int(time.time() * 1000)
    base = {"scope": "endpoint", "scope_key": key, "detector": "value_rate"}
    anomaly_admin.publish_state(settings, {**base, "state": "closed", "changed_at": 2**62,
                                           "reason": "forged"})
    anomaly_admin.publish_state(settings, {**base, "state": "tripped", "changed_at": now,
                                           "reason": "payout_rate_endpoint"})

    def refused() -> float:
        return REGISTRY.get_sample_value("postbacks_gate_control_refused_total",
                                         {"reason": "dated_ahead"}) or 0.0

    async def read() -> HaltBook:
        halts = HaltBook()
        reader = ControlReader(settings, halts, TripWriter(settings, halts))
        await reader.start()
        await reader.stop()
        return halts

    before = refused()
    halts = asyncio.run(read())
    assert halts.halts.get(("endpoint", key)) is not None  # tripped
    assert refused() == before  # replaced by the trip after it

    # a forged change nothing has replaced yet: counted at every start while it stays
    anomaly_admin.publish_state(settings, {**base, "scope_key": f"{key}_b", "state": "closed",
                                           "changed_at": 2**62, "reason": "forged"})
    asyncio.run(read())
    assert refused() == before + 1
    asyncio.run(read())
    assert refused() == before + 2


def test_cli_set_mode_and_status(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = f"ep_{namespace}"
    base = ["anomaly", "set-mode", "--scope", "endpoint", "--key", key, "--actor", "alice"]
    assert run_cli(monkeypatch, settings, *base, "--detector", "value_rate", "--mode",
                   "enforce", "--multiple", "2.5", "--floor-usd", "250") == 0
    out = capsys.readouterr()
    assert "mode enforce" in out.out and f"no endpoint {key!r}" in out.err  # a typo warning
    assert run_cli(monkeypatch, settings, *base, "--detector", "retrodating", "--mode",
                   "detect", "--window-days", "3") == 0
    capsys.readouterr()
    rate, retro = _row(settings, key), _row(settings, key, "retrodating")
    assert rate is not None and rate.params == {"multiple": 2.5, "floor_micros": 250_000_000}
    assert retro is not None and retro.params == {"window_ms": 3 * 86_400_000}

    assert run_cli(monkeypatch, settings, *base, "--detector", "retrodating", "--mode",
                   "enforce", "--multiple", "2") == 2
    err = capsys.readouterr().err
    assert err.startswith("postbacks anomaly set-mode: error: param 'multiple' configures")
    assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "endpoint",
                   "--detector", "value_rate", "--mode", "off", "--actor", "a") == 2
    assert "--key" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, *base, "--detector", "retrodating", "--mode",
                   "enforce", "--burst-count", "80") == 2
    assert "--burst-count goes with --scope global" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "global",
                   "--detector", "value_rate", "--mode", "detect", "--single-multiple", "8",
                   "--actor", "a") == 2
    assert "--single-multiple goes with --scope endpoint" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, *base, "--detector", "value_rate", "--mode",
                   "enforce", "--single-multiple", "0.5") == 2
    assert "single_multiple must be 0 (off) or" in capsys.readouterr().err

    assert _trip(settings, key)
    assert run_cli(monkeypatch, settings, "anomaly", "status", "--json") == 0
    rows = [r for r in json.loads(capsys.readouterr().out) if r["scope_key"] == key]
    assert {(r["detector"], r["mode"], r["state"]) for r in rows} == {
        ("value_rate", "enforce", "tripped"), ("retrodating", "detect", "closed")}
    assert run_cli(monkeypatch, settings, "anomaly", "status") == 0
    out_text = capsys.readouterr().out
    line = next(ln for ln in out_text.splitlines() if key in ln and "value_rate" in ln)
    assert "TRIPPED" in line and "TRIPPED halt(s)" in out_text


def test_cli_global_scope_uses_the_configured_global_key(
    settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # conftest gives every test its own global key: never touch the shared '*' rows here.
    assert settings.anomaly_global_key == namespace
    assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "global",
                   "--detector", "value_rate", "--mode", "enforce", "--multiple", "1.25",
                   "--actor", "alice") == 0
    assert run_cli(monkeypatch, settings, "anomaly", "set-mode", "--scope", "global",
                   "--detector", "retrodating", "--mode", "detect", "--burst-count", "80",
                   "--actor", "alice") == 0
    capsys.readouterr()
    retro = _row(settings, namespace, "retrodating", scope="global")
    assert retro is not None and retro.params == {"burst_count": 80}
    with connect(settings.database_url) as conn:
        assert db.record_trip(conn, scope="global", scope_key=namespace, detector="value_rate",
                              reason="payout_rate_global", observed=1e10, baseline=2e9,
                              at_ms=1_772_409_600_000)
    assert run_cli(monkeypatch, settings, "anomaly", "close", "--scope", "global",
                   "--detector", "value_rate", "--actor", "alice", "--note", "verified") == 0
    [msg] = read_topic(settings, CONTROL, 1)
    assert msg.key() == f"global/{namespace}/value_rate".encode()
    assert decode("BreakerState", msg)["state"] == "closed"
    with connect(settings.database_url) as conn:
        [row] = [r for r in db.load_rows(conn) if (r.scope, r.scope_key, r.detector)
                 == ("global", namespace, "value_rate")]
    assert (row.mode, row.state, row.params) == ("enforce", "closed", {"multiple": 1.25})
