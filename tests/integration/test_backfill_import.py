"""Backfill import of legacy failed deliveries against the real PostgreSQL and console:
a dry run writes nothing; the real run creates dead-lettered deliveries (outcome with the
legacy id, one audit row); a re-run creates nothing new; bad lines are reported by number
and field while the good ones import; a line that does not render with the endpoint's
current config is imported and flagged; support and publishers may not import; an
imported delivery is replayed like any dead letter."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from postbacks.core.identity import delivery_id
from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, upsert_endpoint
from postbacks.settings import Settings
from replay_console.auth import Principal
from replay_console.backfill import import_deliveries
from replay_console.rules import ActionError
from tests.integration.anomaly_helpers import run_cli
from tests.integration.console_util import Client, console_server, token

REVIEWER = Principal("cli", "test", "reviewer", ())  # actor reviewer:test


def _endpoint(settings: Settings, ep: str, app: str, url: str, provider: str = "v3") -> None:
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=url, provider=provider,
                        method="GET" if provider == "v2" else "POST")
        add_secret(conn, SecretBox(settings.secrets_key.reveal()), ep, generate_secret(),
                   now_ms=int(time.time() * 1000))
        conn.commit()


def _lines(ns: str, ep: str, n: int, **extra: object) -> list[dict[str, object]]:
    return [{"legacy_id": f"fw_{ns}_{i}", "endpoint_id": ep, "conversion_id": f"cv_{ns}_{i}",
             "event_type": "conversion", "occurred_at": "2026-03-01T12:00:00Z",
             "payout_usd": "0.75", "last_error": "HTTP 503 from the publisher", **extra}
            for i in range(n)]


def _jsonl(rows: list[dict[str, object]]) -> str:
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def _count(settings: Settings, sql: str, *args: object) -> int:
    with connect(settings.database_url) as conn:
        row = conn.execute(sql, args).fetchone()
    assert row is not None
    return int(row[0])


def test_dry_run_then_import_then_rerun_creates_nothing_new(
        settings: Settings, namespace: str) -> None:
    ns = namespace
    ep, app = f"ep_{ns}_bf", f"app_{ns}_bf"
    _endpoint(settings, ep, app, "https://pub.example/cb")
    text = _jsonl(_lines(ns, ep, 5))
    with connect(settings.database_url) as conn:
        dry = import_deliveries(conn, settings, REVIEWER, text, fmt="jsonl", dry_run=True)
        conn.commit()
    assert dry.counts == {"would_import": 5} and dry.not_rendering == 0
    assert _count(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = %s", ep) == 0

    with connect(settings.database_url) as conn:
        real = import_deliveries(conn, settings, REVIEWER, text, fmt="jsonl", dry_run=False,
                                 source="legacy.jsonl")
        conn.commit()
    assert real.counts == {"imported": 5}
    did = delivery_id(ep, f"cv_{ns}_0", "conversion", None)
    with connect(settings.database_url) as conn:
        status, app_id, payout, snap, err = conn.execute(
            "SELECT status, app_id, payout_usd_micros, snapshot, last_error FROM deliveries"
            " WHERE delivery_id = %s", (did,)).fetchone() or (None,) * 5
        kind, reason, actor = conn.execute(
            "SELECT kind, reason, actor FROM delivery_outcomes WHERE delivery_id = %s",
            (did,)).fetchone() or (None,) * 3
    assert (status, app_id, payout) == ("dead_lettered", app, 750_000)
    assert snap["occurred_at"] == 1772366400000 and snap["producer"] == "backfill"
    assert err == "HTTP 503 from the publisher"
    assert kind == "dead_lettered" and actor == "reviewer:test"
    assert reason == f"imported from legacy failed delivery fw_{ns}_0: HTTP 503 from the publisher"

    with connect(settings.database_url) as conn:
        again = import_deliveries(conn, settings, REVIEWER, text, fmt="jsonl", dry_run=False)
        conn.commit()
    assert again.counts == {"exists": 5}
    assert _count(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = %s", ep) == 5
    assert _count(settings, "SELECT count(*) FROM delivery_outcomes WHERE endpoint_id = %s",
                  ep) == 5
    assert _count(settings, "SELECT count(*) FROM audit_log WHERE action = 'import_deliveries'"
                  " AND target_id = %s", real.sha256[:16]) == 2


def test_bad_lines_are_reported_and_good_ones_import(
        settings: Settings, namespace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ns = namespace
    ep, app = f"ep_{ns}_bl", f"app_{ns}_bl"
    _endpoint(settings, ep, app, "https://pub.example/cb")
    broken = f"ep_{ns}_br"  # a V2 template whose macro the snapshot cannot fill
    _endpoint(settings, broken, app, "https://pub.example/cb?c={conversion_id}&x={no_such}",
              provider="v2")
    good = _lines(ns, ep, 2)
    path = tmp_path / "legacy.csv"
    lines = [
        "legacy_id,endpoint_id,conversion_id,event_type,occurred_at,app_id,snapshot.click",
        f"{good[0]['legacy_id']},{ep},{good[0]['conversion_id']},conversion,1772366400000,,c1",
        f"fw_{ns}_x1,ep_{ns}_nope,cv_{ns}_x1,conversion,1772366400000,,",
        f"fw_{ns}_x2,{ep},cv_{ns}_x2,conversion,1772366400000,app_other,",
        f"fw_{ns}_x3,{ep},cv_{ns}_x3,conversion,2026-03-01 12:00,,",  # no offset
        f"{good[0]['legacy_id']}b,{ep},{good[0]['conversion_id']},conversion,1772366400000,,",
        f"fw_{ns}_x4,{ep},cv_{ns}_x4,conv@@ersion,1772366400000,,",  # @@: a \xff byte
        f"fw_{ns}_r1,{broken},cv_{ns}_r1,conversion,1772366400000,,",
    ]
    path.write_bytes("\n".join(lines).encode().replace(b"@@", b"\xff") + b"\n")
    code = run_cli(monkeypatch, settings, "deliveries", "import", str(path), "--role",
                   "reviewer", "--actor", "ops", "--json")
    out = capsys.readouterr()
    assert code == 1, out.err  # a line is invalid
    report = json.loads(out.out)
    by_line = {x["line"]: x for x in report["lines"]}
    assert by_line[2]["result"] == "imported" and by_line[2]["renders"] is True
    assert by_line[3] == {**by_line[3], "result": "invalid",
                          "message": f"endpoint ep_{ns}_nope does not exist"}
    assert "app_id 'app_other' is not endpoint" in by_line[4]["message"]
    assert by_line[5]["result"] == "invalid" and "occurred_at" in by_line[5]["message"]
    assert by_line[6]["result"] == "duplicate" and "same delivery as line 2" in \
        by_line[6]["message"]
    assert by_line[7]["result"] == "invalid" and "event_type" in by_line[7]["message"]
    assert by_line[8]["result"] == "imported" and by_line[8]["renders"] is False
    assert "no_such" in by_line[8]["render_error"]
    assert report["counts"] == {"duplicate": 1, "imported": 2, "invalid": 4}
    assert "2 imported" in out.err and "4 invalid" in out.err
    assert _count(settings, "SELECT count(*) FROM deliveries WHERE endpoint_id = ANY(%s)",
                  [ep, broken]) == 2
    with connect(settings.database_url) as conn:
        snap = conn.execute("SELECT snapshot FROM deliveries WHERE delivery_id = %s",
                            (by_line[2]["delivery_id"],)).fetchone()
    assert snap is not None and snap[0]["source_snapshot"] == {"click": "c1"}

    # the CLI refuses an import by nobody, support (the default role) and a missing file,
    # with clear errors
    assert run_cli(monkeypatch, settings, "deliveries", "import", str(path), "--role",
                   "admin") == 2
    assert "--actor NAME is required" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "deliveries", "import", str(path), "--actor",
                   "ops") == 1
    assert "a support may not import deliveries" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "deliveries", "import", str(tmp_path / "no.csv"),
                   "--role", "admin", "--actor", "ops") == 2
    assert "cannot read" in capsys.readouterr().err


def test_console_api_import_and_refusals(settings: Settings, namespace: str) -> None:
    ns = namespace
    ep, app = f"ep_{ns}_api", f"app_{ns}_api"
    _endpoint(settings, ep, app, "https://pub.example/cb")
    text = _jsonl(_lines(ns, ep, 3))
    with console_server(settings) as port:
        admin = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        r = admin.post("/api/v1/import", body={"data": text, "dry_run": True})
        assert r.status == 200, r.text
        assert r.json()["counts"] == {"would_import": 3}
        r = admin.post("/api/v1/import", body={"data": text + "{broken\n", "format": "jsonl"})
        assert r.status == 422, r.text
        assert r.json()["counts"] == {"imported": 3, "invalid": 1}
        r = admin.post("/api/v1/import", body={"data": text})
        assert r.status == 200 and r.json()["counts"] == {"exists": 3}
        for bad, why in (({"data": ""}, "paste the CSV or JSONL"),
                         ({"data": text, "format": "xml"}, "format must be one of"),
                         ({"data": ["a"]}, "paste the CSV")):
            r = admin.post("/api/v1/import", body=bad)
            assert r.status == 400 and why in r.text, r.text
        support = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        r = support.post("/api/v1/import", body={"data": text, "dry_run": True})
        assert r.status == 403 and "may not import" in r.text
        assert support.get("/import").status == 403
        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", (app,)))
        # staff-only pages do not exist for a publisher
        assert pub.post("/api/v1/import", body={"data": text}).status == 404

        # an imported delivery replays like any dead letter
        did = delivery_id(ep, f"cv_{ns}_0", "conversion", None)
        r = admin.post(f"/api/v1/deliveries/{did}/replay", body={})
        assert r.status == 202, r.text
        job = r.json()["job_id"]
    assert _count(settings, "SELECT count(*) FROM audit_log WHERE action = 'import_deliveries'"
                  " AND actor LIKE %s", f"%adm-{ns}%") == 2
    assert _count(settings, "SELECT count(*) FROM replay_items WHERE job_id = %s"
                  " AND delivery_id = %s", job, did) == 1


def test_a_role_without_the_right_is_refused_before_anything_is_read(
        settings: Settings) -> None:
    with connect(settings.database_url) as conn, pytest.raises(ActionError) as exc:
        import_deliveries(conn, settings, Principal("cli", "s", "support", ()), "x",
                          fmt="csv", dry_run=True)
    assert exc.value.status == 403
