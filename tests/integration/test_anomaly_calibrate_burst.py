"""``postbacks anomaly calibrate`` recommends the retrodated burst's ``burst_count`` from a
history in PostgreSQL: a count too low trips on the history's own late approvals; the
recommendation, applied with ``--apply-burst`` (audited, the row's mode kept), re-runs with
zero trips outside a labelled incident, which still trips within minutes. Each endpoint's
own retrodating window decides what is retrodated, as in the gate."""

from __future__ import annotations

import dataclasses
import json
import random
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pytest

from postbacks.db.anomaly import load_rows, set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import audit_rows, run_cli

USD = 1_000_000
MIN = 60_000
DAY = 1440 * MIN


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _report(out: str) -> dict:  # type: ignore[type-arg]
    return json.loads(out[out.index("\n{") + 1:out.rindex("}") + 1])  # type: ignore[no-any-return]


@pytest.fixture()
def history(settings: Settings, namespace: str):  # type: ignore[no-untyped-def]
    """Two weeks, about 2 deliveries a minute, one in 20 retrodated (8-40 days old); on
    day 8 a benign batch of 15 late approvals in 3 minutes; an hour of 20 retrodated
    deliveries a minute on day 12 (the incident); and on day 5 an hour of 10 a minute,
    10 days old, to an endpoint whose own window is 30 days (not retrodated for it)."""
    rng = random.Random(zlib.crc32(namespace.encode()))
    t0 = int(datetime(2044, 1, 4, tzinfo=UTC).timestamp() * 1000) + rng.randrange(50) * 20 * DAY
    incident = (t0 + 12 * DAY + 9 * 60 * MIN, t0 + 12 * DAY + 10 * 60 * MIN)
    long_hour = t0 + 5 * DAY + 14 * 60 * MIN
    batch = t0 + 8 * DAY + 3 * 60 * MIN
    ep, ep_long = f"ep_{namespace}", f"ep_{namespace}_long"
    n = 0
    with connect(settings.database_url) as conn, conn.cursor() as cur:
        with cur.copy("COPY deliveries (delivery_id, endpoint_id, app_id, conversion_id,"
                      " event_type, event_id, idempotency_key, payout_usd_micros, snapshot,"
                      " created_at) FROM STDIN") as cp:

            def row(endpoint: str, at: int, age_days: float) -> None:
                nonlocal n
                n += 1
                created = at - 60_000
                snap = {"occurred_at": at, "payout_usd_micros": 2 * USD,
                        "source_created_at": created,
                        "source_completed_at": created - int(age_days * DAY)}
                cp.write_row((f"cb_{namespace}_{n}", endpoint, f"app_{namespace}",
                              f"cv_{namespace}_{n}", "purchase", f"evt_{namespace}_{n}",
                              f"msg_{namespace}_{n}", 2 * USD, json.dumps(snap), _iso(at)))

            for i in range(14 * 1440):
                at = t0 + i * MIN
                for _ in range(sum(1 for _ in range(8) if rng.random() < 0.25)):
                    old = rng.random() < 0.05
                    row(ep, at + rng.randrange(MIN), rng.uniform(8, 40) if old else 0.5)
                if incident[0] <= at < incident[1]:
                    for _ in range(20):
                        row(ep, at + rng.randrange(MIN), rng.uniform(8, 40))
                if batch <= at < batch + 3 * MIN:
                    for _ in range(5):
                        row(ep, at + rng.randrange(MIN), 12)
                if long_hour <= at < long_hour + 60 * MIN:
                    for _ in range(10):
                        row(ep_long, at + rng.randrange(MIN), 10)
        conn.commit()
    yield t0, t0 + 14 * DAY, incident
    with connect(settings.database_url) as conn:
        conn.execute("DELETE FROM deliveries WHERE delivery_id LIKE %s", (f"cb_{namespace}_%",))
        conn.commit()


def _burst_row(settings: Settings) -> tuple[str, dict]:  # type: ignore[type-arg]
    with connect(settings.database_url) as conn:
        for r in load_rows(conn):
            if (r.scope, r.scope_key, r.detector) == ("global", settings.anomaly_global_key,
                                                       "retrodating"):
                return r.mode, dict(r.params)
    raise AssertionError("no global retrodating row")


def test_burst_count_recommended_applied_then_rerun_trips_only_on_the_incident(
    settings: Settings, namespace: str, history: tuple[int, int, tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    since, until, incident = history
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="global", scope_key=settings.anomaly_global_key,
                 detector="retrodating", mode="enforce", params={"burst_count": 4},
                 actor="test")
        set_mode(conn, scope="endpoint", scope_key=f"ep_{namespace}_long",
                 detector="retrodating", mode="detect", params={"window_ms": 30 * DAY},
                 actor="test")
        conn.commit()
    window = ["--from", _iso(since), "--to", _iso(until), "--quiet"]
    labelled = ["--incident-start", _iso(incident[0]), "--incident-end", _iso(incident[1])]

    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *labelled,
                   "--json") == 0
    out = capsys.readouterr().out
    burst = _report(out)["burst"]
    assert "retrodated burst (15-min span; the global retrodating row: burst_count 4" in out
    assert burst["current"] == 4
    assert burst["trips_outside"]["current"] > 0  # 4 trips on the benign batch
    # the benign batch and the noise about it: neither the incident nor the 30-day
    # endpoint's 10-day-old hour (150 in a span, were the default 7-day window taken)
    need = burst["needed"]["count"]
    assert 15 <= need < 30, burst
    rec = burst["recommended"]
    assert rec >= max(20, need + 1, need * 1.5)
    assert burst["trips_outside"]["recommended"] == 0
    assert 20 * 60 + 15 <= burst["retrodated"] < 20 * 60 + 15 + 0.2 * 14 * 1440
    assert "--apply-burst the burst_count" in out
    assert _burst_row(settings) == ("enforce", {"burst_count": 4})  # nothing written

    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *labelled,
                   "--apply-burst", "--actor", "alice", "--note", "two weeks") == 0
    out = capsys.readouterr().out
    assert f"burst_count {rec} (audited" in out and "halts nothing" not in out
    assert _burst_row(settings) == ("enforce", {"burst_count": rec})  # its mode kept
    audit = audit_rows(settings, [f"global/{settings.anomaly_global_key}/retrodating"])
    assert audit[-1]["actor"] == "alice" and audit[-1]["note"] == "two weeks"
    assert audit[-1]["after"]["params"]["burst_count"] == rec

    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *labelled,
                   "--json") == 0
    burst = _report(capsys.readouterr().out)["burst"]
    assert burst["current"] == rec and burst["trips_outside"]["current"] == 0
    tripped = burst["incident_trip_ms"]["current"]
    # 20 a minute over a count of at most 45: within the incident's first three minutes
    assert tripped is not None and tripped - incident[0] <= 3 * MIN, (tripped, incident)
    print(f"\nburst_count 4 tripped outside the incident; busiest benign span {need}; "
          f"recommended {rec}; re-run: 0 trips outside, the incident tripped "
          f"{(tripped - incident[0]) / MIN:.0f} min after its start")


def _file_history(tmp_path: Path, base: int) -> Path:
    """An hour of conversions from ``base``: each minute three 9 days old (ISO-8601 times
    on odd minutes, epoch ms on even ones) and one a minute old."""
    lines = []
    for i in range(60):
        at = base + i * MIN
        old = at - 9 * DAY
        created = _iso(at) if i % 2 else at  # ISO-8601 with an offset, or epoch ms
        completed = _iso(old) if i % 2 else old
        for _ in range(3):
            lines.append({"occurred_at": at, "payout_usd_micros": USD,
                          "source_created_at": created, "source_completed_at": completed})
        lines.append({"occurred_at": at, "payout_usd_micros": USD,
                      "source_created_at": at, "source_completed_at": at - 60_000})
    path = tmp_path / "history.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_a_file_with_iso_times_and_the_burst_off(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """From a file, offline: ISO-8601 and epoch source times both count; with no
    burst_count the burst is reported off and only the recommendation is shown."""
    base = int(datetime(2004, 3, 1, tzinfo=UTC).timestamp() * 1000)
    path = _file_history(tmp_path, base)
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--file", str(path),
                   "--from", _iso(base), "--to", _iso(base + 60 * MIN), "--quiet",
                   "--json") == 0
    out = capsys.readouterr().out
    burst = _report(out)["burst"]
    assert "the global retrodating row: off (no burst_count)" in out
    assert burst["retrodated"] == 180 and burst["current"] == 0
    assert burst["needed"]["count"] == 45  # 3 a minute over the first 15 minutes
    assert burst["recommended"] == 68  # 45 x 1.5, rounded up
    assert burst["trips_outside"] == {"current": 0, "recommended": 0}
    # applied with no global retrodating row: created off, arming nothing
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--file", str(path),
                   "--from", _iso(base), "--to", _iso(base + 60 * MIN), "--quiet",
                   "--apply-burst", "--actor", "bob") == 0
    out = capsys.readouterr().out
    assert "burst_count 68" in out and "halts nothing until the row is set to enforce" in out
    assert _burst_row(settings) == ("off", {"burst_count": 68})


def test_apply_and_apply_burst_write_both_rows_or_neither(
    settings: Settings, own_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--apply --apply-burst`` is one transaction: when PostgreSQL refuses the burst's
    row (here a trigger; in life a constraint, a lock timeout, a failover), the k and h
    written just before it are rolled back too, and the command says nothing was applied."""
    own = dataclasses.replace(settings, database_url=own_database)
    base = int(datetime(2004, 3, 1, tzinfo=UTC).timestamp() * 1000)
    argv = ("anomaly", "calibrate", "--file", str(_file_history(tmp_path, base)), "--from",
            _iso(base), "--to", _iso(base + 60 * MIN), "--quiet", "--apply", "--apply-burst",
            "--actor", "carol")
    with connect(own.database_url) as conn:
        conn.execute("CREATE FUNCTION refuse_retrodating() RETURNS trigger LANGUAGE plpgsql"
                      " AS $$ BEGIN IF NEW.detector = 'retrodating' THEN"
                      " RAISE EXCEPTION 'retrodating rows are frozen'; END IF;"
                      " RETURN NEW; END $$")
        conn.execute("CREATE TRIGGER refuse_retrodating BEFORE INSERT OR UPDATE ON"
                      " payout_anomaly_settings FOR EACH ROW EXECUTE FUNCTION"
                      " refuse_retrodating()")
        conn.commit()
    assert run_cli(monkeypatch, own, *argv) == 2
    err = capsys.readouterr().err
    assert "nothing applied" in err and "retrodating rows are frozen" in err, err
    with connect(own.database_url) as conn:
        assert load_rows(conn) == []  # the value-rate row written first: rolled back
        assert audit_rows(own, [f"global/{own.anomaly_global_key}/value_rate"]) == []
        conn.execute("DROP TRIGGER refuse_retrodating ON payout_anomaly_settings")
        conn.commit()
    assert run_cli(monkeypatch, own, *argv) == 0
    out = capsys.readouterr().out
    assert "applied: global/" in out and "burst_count 68" in out
    with connect(own.database_url) as conn:
        got = {(r.detector, r.mode) for r in load_rows(conn)}
    assert got == {("value_rate", "detect"), ("retrodating", "off")}


def test_apply_burst_needs_an_actor_and_the_global_scope(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--apply-burst") == 2
    assert "--actor" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--scope", "endpoint",
                   "--apply-burst", "--actor", "a") == 2
    assert "global scope" in capsys.readouterr().err
    for bad in ("-1", "nan", "inf"):
        assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--burst-margin",
                       bad) == 2
        assert "--burst-margin" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--margin", "nan") == 2
    assert "--margin" in capsys.readouterr().err
