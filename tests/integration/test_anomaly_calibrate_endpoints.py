"""``postbacks anomaly calibrate --scope endpoint`` on a history stored in PostgreSQL (its
own database: the endpoints' default row is one for the whole database). A default ``k``
too low trips every endpoint on its own noise; the recommendation for the default row,
applied with ``--apply`` (audited, the mode kept), re-runs with zero trips outside the
incident, an endpoint with a row of its own keeps it, and the incident on one endpoint
still trips within minutes."""

from __future__ import annotations

import dataclasses
import json
import math
import random
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
T0 = int(datetime(2001, 1, 1, tzinfo=UTC).timestamp() * 1000)  # a Monday
WEEKS = 3
INCIDENT = (T0 + 17 * DAY + 10 * 60 * MIN, T0 + 17 * DAY + 16 * 60 * MIN)
# endpoint -> (conversions a minute at the daily mean, median payout USD)
RATES = {"busy": (3.0, 2.0), "sparse": (0.1, 20.0), "own": (1.0, 5.0)}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _insert(settings: Settings) -> int:
    """Deliveries rows as the sink writes them: a diurnal swing, lognormal payouts; the
    busy endpoint at x4 within INCIDENT."""
    rng = random.Random(7)
    n = 0
    with connect(settings.database_url) as conn, conn.cursor() as cur:
        with cur.copy("COPY deliveries (delivery_id, endpoint_id, app_id, conversion_id,"
                      " event_type, event_id, idempotency_key, payout_usd_micros, snapshot,"
                      " created_at) FROM STDIN") as cp:
            for i in range(WEEKS * 7 * 1440):
                at = T0 + i * MIN
                swing = 1 + 0.5 * math.sin(2 * math.pi * (i % 1440) / 1440)
                for ep, (rate, median) in RATES.items():
                    lam = rate * swing * (4 if ep == "busy" and
                                          INCIDENT[0] <= at < INCIDENT[1] else 1)
                    k = 0
                    while rng.random() < lam / (lam + 1) and k < 50:  # geometric, mean lam
                        k += 1
                        n += 1
                        pay = int(rng.lognormvariate(math.log(median), 0.6) * USD)
                        occurred = at + rng.randrange(MIN)
                        cp.write_row((f"ce_{n}", f"ep_{ep}", f"app_{ep}", f"cv_{n}",
                                      "purchase", f"evt_{n}", f"msg_{n}", pay,
                                      json.dumps({"occurred_at": occurred,
                                                  "payout_usd_micros": pay}),
                                      _iso(occurred)))
        conn.commit()
    return n


def _default_row(settings: Settings) -> tuple[str, dict[str, float]] | None:
    with connect(settings.database_url) as conn:
        for r in load_rows(conn):
            if (r.scope, r.scope_key, r.detector) == ("endpoint", "*", "value_rate"):
                return r.mode, dict(r.params)
    return None


def test_the_default_rows_recommendation_applied_then_rerun_trips_only_the_incident(
    settings: Settings, own_database: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = dataclasses.replace(settings, database_url=own_database)
    assert _insert(settings) > 100_000
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="endpoint", scope_key="*", detector="value_rate",
                 mode="enforce", params={"k": 0.5, "h": 1.0, "floor_micros": USD},
                 actor="test")
        set_mode(conn, scope="endpoint", scope_key="ep_own", detector="value_rate",
                 mode="detect", params={"k": 9.0}, actor="test")
        conn.commit()
    window = ["--scope", "endpoint", "--from", _iso(T0), "--to", _iso(T0 + WEEKS * 7 * DAY)]
    incident = ["--incident-start", _iso(INCIDENT[0]), "--incident-end", _iso(INCIDENT[1])]

    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *incident,
                   "--json", "--quiet") == 0
    out = capsys.readouterr().out
    assert "3 endpoints" in out and "1 with a value-rate row of their own" in out
    report = json.loads(out[out.index("\n{") + 1:out.rindex("}") + 1])
    assert sum(d["trips"] for d in report["days"]) > 0  # k 0.5 trips on noise
    eps = {e["endpoint"]: e for e in report["endpoints"]}
    assert set(eps) == {"ep_busy", "ep_sparse", "ep_own"}
    assert eps["ep_own"]["own_row"] and not eps["ep_busy"]["own_row"]
    follow = [e["needed"]["k"] for e in eps.values() if not e["own_row"] and e["needed"]]
    rec_k, rec_h = report["recommended"]["k"], report["recommended"]["cusum_h"]
    assert follow and rec_k >= 3.0 and rec_k >= max(follow) + 0.5 - 0.01
    assert rec_h >= 8.0
    assert report["recommended"]["floor_micros"] == USD  # the row's other params kept
    assert "with it: 0 trips outside the incident" in out
    assert "incident, recommended: 1 endpoint(s) tripped" in out
    minutes = out.split("incident, recommended: 1 endpoint(s) tripped")[1].split(" min ")[0]
    assert 0 <= int(minutes.rsplit(", ", 1)[1]) <= 30, minutes
    assert _default_row(settings) == ("enforce", {"k": 0.5, "h": 1.0, "floor_micros": USD})

    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *incident,
                   "--quiet", "--apply", "--actor", "alice", "--note", "3 weeks") == 0
    out = capsys.readouterr().out
    assert "applied: endpoint/*/value_rate mode enforce" in out
    assert _default_row(settings) == ("enforce", {"k": rec_k, "h": rec_h,
                                                  "floor_micros": USD})
    audit = audit_rows(settings, ["endpoint/*/value_rate"])
    assert audit[-1]["actor"] == "alice" and audit[-1]["note"] == "3 weeks"
    assert audit[-1]["after"]["params"]["k"] == rec_k

    # Re-run with what was applied: no trip outside the incident, the own row unchanged.
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", *window, *incident,
                   "--json", "--quiet") == 0
    out = capsys.readouterr().out
    again = json.loads(out[out.index("\n{") + 1:out.rindex("}") + 1])
    assert sum(e["trips_outside"] for e in again["endpoints"]) == 0
    assert again["current_default"]["k"] == rec_k


def test_refusals_and_a_file_without_endpoints(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--scope", "endpoint",
                   "--top", "0") == 2
    assert "--top must be >= 1" in capsys.readouterr().err
    f = tmp_path / "conversions.jsonl"
    f.write_text(json.dumps({"occurred_at": T0, "payout_usd_micros": USD}) + "\n")
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--scope", "endpoint",
                   "--file", str(f), "--from", _iso(T0 - DAY), "--to", _iso(T0 + DAY)) == 1
    err = capsys.readouterr().err
    assert "1 records without an endpoint_id left out" in err
    assert "needs an endpoint_id per line" in err
    f.write_text("\n".join(json.dumps({"endpoint_id": "ep_f", "conversion": {
        "occurred_at": T0 + i * MIN, "payout_usd_micros": USD}}) for i in range(30)) + "\n")
    assert run_cli(monkeypatch, settings, "anomaly", "calibrate", "--scope", "endpoint",
                   "--file", str(f), "--from", _iso(T0 - DAY), "--to", _iso(T0 + DAY),
                   "--quiet") == 0
    assert "1 endpoints, 30 endpoint-minutes" in capsys.readouterr().out
