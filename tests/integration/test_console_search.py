"""Support's search and lists in the console, against the real console and PostgreSQL:
finding a delivery by any of its ids (index lookups, a publisher only its own), the error
class and date-range filters (pages, API, CLI; bad values are a 400 that names them), the
dead letters paged with filters and counts per reason, and event types checked on save."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pytest

from postbacks.core.endpoint import EndpointConfig
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries, run_cli
from tests.integration.console_util import Client, console_server, token


def _world(settings: Settings, ns: str) -> dict[str, Any]:
    """Two apps with an endpoint each; deliveries 1-3 of app a (1 failing with http_503,
    created two days ago; 3 held after an http_404), 4 of app b."""
    w: dict[str, Any] = {"a": f"app_{ns}_a", "b": f"app_{ns}_b",
                         "ep_a": f"ep_{ns}_a", "ep_b": f"ep_{ns}_b"}
    with connect(settings.database_url) as conn:
        for app, ep in ((w["a"], w["ep_a"]), (w["b"], w["ep_b"])):
            upsert_endpoint(conn, endpoint_id=ep, app_id=app,
                            url=f"https://pub.example/{ep}", config=EndpointConfig())
        conn.commit()
    for n, app, status in ((1, "a", "failing"), (2, "a", "delivered"), (3, "a", "held"),
                           (4, "b", "delivered")):
        d = held_delivery(ns, n, endpoint=w[f"ep_{app}"], app=w[app])
        insert_deliveries(settings, [d], status=status)
        w[f"d{n}"] = d
    w["old"] = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
    with connect(settings.database_url) as conn:
        conn.execute("UPDATE deliveries SET last_error = 'http_503', created_at = %s"
                     " WHERE delivery_id = %s", (w["old"], f"dlv_{ns}_1"))
        conn.execute("UPDATE deliveries SET last_error = 'timeout' WHERE delivery_id = %s",
                     (f"dlv_{ns}_2",))
        conn.execute("UPDATE deliveries SET last_error = 'http_404' WHERE delivery_id = %s",
                     (f"dlv_{ns}_3",))
        conn.commit()
    return w


def _ids(reply: Any) -> set[str]:
    return {r["delivery_id"] for r in reply.json()["deliveries"]}


def test_find_a_delivery_by_any_of_its_ids(settings: Settings, namespace: str) -> None:
    ns = namespace
    w = _world(settings, ns)
    d1 = w["d1"]
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        for key in (d1["delivery_id"], d1["conversion"]["conversion_id"],
                    d1["idempotency_key"]):  # the idempotency key is the webhook-id
            r = sup.get(f"/api/v1/deliveries?q={key}")
            assert r.status == 200, r.text
            assert _ids(r) == {f"dlv_{ns}_1"}, key
        # exact match only: a prefix finds nothing
        assert _ids(sup.get(f"/api/v1/deliveries?q={d1['idempotency_key'][:-2]}")) == set()
        # combined with a filter
        assert _ids(sup.get(f"/api/v1/deliveries?q=cv_{ns}_1&status=delivered")) == set()
        r = sup.get("/api/v1/deliveries?q=a%20b")
        assert r.status == 400 and "is not an id" in r.json()["error"]
        assert sup.get("/api/v1/deliveries?q=dlv_*").status == 400

        # a publisher finds its own, never another app's, never a held one
        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", (w["a"],)))
        assert _ids(pub.get(f"/api/v1/deliveries?q=cv_{ns}_2")) == {f"dlv_{ns}_2"}
        assert _ids(pub.get(f"/api/v1/deliveries?q=cv_{ns}_4")) == set()
        assert _ids(pub.get(f"/api/v1/deliveries?q={w['d4']['idempotency_key']}")) == set()
        assert _ids(pub.get(f"/api/v1/deliveries?q=dlv_{ns}_3")) == set()

        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        html = page.get(f"/deliveries?q={d1['idempotency_key']}").text
        assert f"dlv_{ns}_1" in html and f"dlv_{ns}_2" not in html
        assert 'name="q"' in html and f'value="{d1["idempotency_key"]}"' in html

    # every arm of the search is an index lookup, not a scan of deliveries
    with connect(settings.database_url) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT delivery_id FROM deliveries d WHERE d.delivery_id = 'x'"
            " OR d.conversion_id = 'x' OR d.idempotency_key = 'x'"))
        conn.execute("RESET enable_seqscan")
        # (each day partition's copy of the primary key and of the two indexes)
        for index in ("_pkey", "_conversion_id_idx", "_idempotency_key_idx"):
            assert index in plan, plan
        assert "Seq Scan" not in plan, plan


def test_error_class_and_date_range_filters(settings: Settings, namespace: str,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    ns = namespace
    w = _world(settings, ns)
    today = dt.datetime.now(dt.UTC).date()
    old_day = w["old"].date().isoformat()
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        base = f"/api/v1/deliveries?app={w['a']}"
        # a status family matches every status in it; an exact class only itself
        assert _ids(sup.get(f"{base}&error_class=http_5xx")) == {f"dlv_{ns}_1"}
        assert _ids(sup.get(f"{base}&error_class=http_503")) == {f"dlv_{ns}_1"}
        assert _ids(sup.get(f"{base}&error_class=http_500")) == set()
        assert _ids(sup.get(f"{base}&error=http_4xx")) == {f"dlv_{ns}_3"}
        assert _ids(sup.get(f"{base}&error_class=http_x5xx")) == set()
        assert _ids(sup.get(f"{base}&error_class=timeout")) == {f"dlv_{ns}_2"}
        # a date includes the whole day; a time with an offset is exact
        assert _ids(sup.get(f"{base}&created_from={old_day}&created_to={old_day}")) \
            == {f"dlv_{ns}_1"}
        assert _ids(sup.get(f"{base}&created_from={today.isoformat()}")) \
            == {f"dlv_{ns}_2", f"dlv_{ns}_3"}
        cut = (w["old"] + dt.timedelta(hours=1)).astimezone(
            dt.timezone(dt.timedelta(hours=2))).isoformat().replace("+", "%2B")
        assert _ids(sup.get(f"{base}&created_to={cut}")) == {f"dlv_{ns}_1"}
        for bad, words in (("created_from=yesterday", "created_from must be a date"),
                           ("created_to=2026-13-40", "created_to must be a date"),
                           (f"created_from={today}&created_to={old_day}", "must be before"),
                           ("error_class=a%20b", "is not an error class"),
                           ("created_from=2026-01-01&since=2026-01-01", "not both"),
                           ("color=red", "unknown filter")):
            r = sup.get(f"{base}&{bad}")
            assert r.status == 400 and words in r.json()["error"], (bad, r.text)
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        html = page.get(f"/deliveries?app={w['a']}&error_class=http_5xx").text
        assert f"dlv_{ns}_1" in html and f"dlv_{ns}_2" not in html
        r = page.get("/deliveries?created_from=nope")
        assert r.status == 400 and "created_from must be a date" in r.text

    assert run_cli(monkeypatch, settings, "deliveries", "list", "--app", w["a"],
                   "--error-class", "http_5xx", "--json") == 0
    assert _ids_json(capsys.readouterr().out) == {f"dlv_{ns}_1"}
    assert run_cli(monkeypatch, settings, "deliveries", "list", "--app", w["a"],
                   "--from", old_day, "--to", old_day, "--json") == 0
    assert _ids_json(capsys.readouterr().out) == {f"dlv_{ns}_1"}
    assert run_cli(monkeypatch, settings, "deliveries", "list",
                   "--search", w["d2"]["idempotency_key"], "--json") == 0
    assert _ids_json(capsys.readouterr().out) == {f"dlv_{ns}_2"}
    assert run_cli(monkeypatch, settings, "deliveries", "list", "--from", "soon") == 2
    assert "created_from must be a date" in capsys.readouterr().err


def _ids_json(out: str) -> set[str]:
    return {r["delivery_id"] for r in json.loads(out)["deliveries"]}


def _dead_letters(settings: Settings, ns: str) -> dict[str, Any]:
    """12 dead letters of one endpoint: 7 permanent (agent), 5 exhausted (delivery), one
    a day apart each, the last 3 exhausted ones resolved; and one of another endpoint."""
    ep, other = f"ep_{ns}_dl", f"ep_{ns}_other"
    now = dt.datetime.now(dt.UTC)
    with connect(settings.database_url) as conn:
        for i in range(13):
            reason, stage = ("permanent", "agent") if i < 7 else ("exhausted", "delivery")
            conn.execute(
                "INSERT INTO dead_letters (dead_letter_id, reason, error_class, error_message,"
                " stage, origin_topic, origin_partition, origin_offset, delivery_id,"
                " endpoint_id, occurred_at, resolved_at, resolved_by) VALUES (%s, %s,"
                " 'DeadLetterError', 'http_404', %s, 'dispatch.v1', 0, %s, NULL, %s, %s,"
                " %s, %s)",
                (f"dl_{ns}_{i:02d}", reason, stage, i, other if i == 12 else ep,
                 now - dt.timedelta(days=i), now if 9 <= i < 12 else None,
                 "sup" if 9 <= i < 12 else None))
        conn.commit()
    return {"ep": ep, "other": other, "now": now}


def test_dead_letters_paged_with_filters_and_counts(settings: Settings,
                                                     namespace: str) -> None:
    ns = namespace
    x = _dead_letters(settings, ns)
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        base = f"/api/v1/dead-letters?endpoint={x['ep']}&all=1&limit=5"
        first = sup.get(base).json()
        assert first["total"] == 12
        assert first["by_reason"] == {"permanent": 7, "exhausted": 5}
        assert [d["dead_letter_id"] for d in first["dead_letters"]] == \
            [f"dl_{ns}_{i:02d}" for i in range(5)]
        assert first["previous"] is None and first["next"]
        seen = [d["dead_letter_id"] for d in first["dead_letters"]]
        page = first
        while page["next"]:
            page = sup.get(f"/api/v1/dead-letters{page['next']}").json()
            seen += [d["dead_letter_id"] for d in page["dead_letters"]]
        assert seen == [f"dl_{ns}_{i:02d}" for i in range(12)]  # every row once, in order
        back = sup.get(f"/api/v1/dead-letters{page['previous']}").json()
        assert back["dead_letters"][0]["dead_letter_id"] == f"dl_{ns}_05"

        # unresolved only (the default), and the counts follow the filter
        r = sup.get(f"/api/v1/dead-letters?endpoint={x['ep']}").json()
        assert r["total"] == 9 and r["by_reason"] == {"permanent": 7, "exhausted": 2}
        r = sup.get(f"/api/v1/dead-letters?endpoint={x['ep']}&all=1&stage=delivery").json()
        assert r["total"] == 5 and r["by_reason"] == {"exhausted": 5}
        r = sup.get(f"/api/v1/dead-letters?endpoint={x['ep']}&all=1&reason=permanent").json()
        assert r["total"] == 7 and {d["reason"] for d in r["dead_letters"]} == {"permanent"}
        day = (x["now"] - dt.timedelta(days=3)).date().isoformat()
        r = sup.get(f"/api/v1/dead-letters?endpoint={x['ep']}&all=1&created_from={day}"
                    f"&created_to={day}").json()
        assert [d["dead_letter_id"] for d in r["dead_letters"]] == [f"dl_{ns}_03"]
        r = sup.get(f"/api/v1/dead-letters?endpoint={x['other']}").json()
        assert [d["dead_letter_id"] for d in r["dead_letters"]] == [f"dl_{ns}_12"]
        for bad, words in (("offset=-1", "offset must be a whole number"),
                           ("limit=0", "limit must be a whole number"),
                           ("created_from=someday", "created_from must be a date"),
                           ("stage=a%20b", "stage 'a b' is not valid"),
                           ("all=yes", "all must be 1"), ("sort=asc", "unknown filter")):
            r2 = sup.get(f"/api/v1/dead-letters?{bad}")
            assert r2.status == 400 and words in r2.json()["error"], (bad, r2.text)

        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", ("app_x",)))
        assert pub.get("/api/v1/dead-letters").status in (403, 404)

        html_client = Client(port)
        html_client.sign_in(token(settings, f"sup2-{ns}", "support"))
        html = html_client.get(f"/dead-letters?endpoint={x['ep']}&all=1&limit=5&offset=5").text
        assert "12 dead letter(s) match; showing 6 to 10" in html
        assert 'id="next"' in html and 'id="previous"' in html
        assert "<td>permanent</td><td>7</td>" in html


def test_event_types_are_checked_on_save(settings: Settings, namespace: str) -> None:
    ns = namespace
    w = _world(settings, ns)
    with console_server(settings) as port:
        admin = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        path = f"/api/v1/endpoints/{w['ep_a']}"
        r = admin.post(path, body={"event_types": ["conversion", "convresion", "rewards"]})
        assert r.status == 422, r.text
        [problem] = [p for p in r.json()["problems"] if "event type" in p]
        assert "'convresion'" in problem and "'rewards'" in problem and "known:" in problem
        assert admin.get(path).json()["event_types"] == ["*"]  # nothing saved
        r = admin.post(path, body={"event_types": ["conversion", "reward"]})
        assert r.status == 200, r.text
        assert admin.get(path).json()["event_types"] == ["conversion", "reward"]
        assert admin.post(path, body={"event_types": ["*"]}).status == 200


def _audited(settings: Settings, endpoint_id: str) -> list[tuple[str, Any]]:
    with connect(settings.database_url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT action, after FROM audit_log WHERE target_id = %s ORDER BY audit_id",
            (endpoint_id,))]


def test_endpoint_creation_in_the_console_and_the_cli(
        settings: Settings, namespace: str, stack: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from postbacks.tools.procs import free_port, http_json, wait_for

    ns = namespace
    app = f"app_{ns}_new"
    rport = free_port()
    stack.start("receiver", "receiver", "--port", str(rport))
    rbase = f"http://127.0.0.1:{rport}"
    wait_for(lambda: http_json(f"{rbase}/_control/stats"), 30, what="receiver")

    def lookup(host: str) -> list[str]:
        return {"internal.test": ["10.1.2.3"]}.get(host) or ["93.184.216.34"]

    with console_server(settings, lookup=lookup) as port:
        admin = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        url = f"{rbase}/hooks/{ns}"
        assert sup.post("/api/v1/endpoints", body={"app_id": app, "url": url}).status == 403
        # the edit's checks: SSRF, provider, macros, event types; nothing is stored
        for body, words in (
                ({"url": "http://internal.test/"}, "does not resolve to an address postbacks"),
                ({"provider": "v9"}, "unknown provider 'v9'"),
                ({"event_types": ["conversoin"]}, "unknown event type(s): 'conversoin'"),
                ({"config": {"headers": {"webhook-id": "x"}}}, "webhook-id"),
                ({"config": {"headers": {"Host": "x.example"}}}, "'Host' is set by the HTTP"),
                ({"config": {"headers": {"X-Name": "café"}}}, "non-ASCII character"),
                ({"config": {"redact_fields": ["plyer_id"]}},
                 "redact_fields names 'plyer_id', which this endpoint's requests do not")):
            r = admin.post("/api/v1/endpoints", body={"app_id": app, "url": url, **body})
            assert r.status == 422, r.text
            assert any(words in p for p in r.json()["problems"]), (body, r.text)
        with connect(settings.database_url) as conn:
            assert conn.execute("SELECT count(*) FROM endpoints WHERE app_id = %s",
                                (app,)).fetchone() == (0,)
        r = admin.post("/api/v1/endpoints", body={"app_id": app, "url": url,
                                                  "event_types": ["conversion"]})
        assert r.status == 201, r.text
        made = r.json()
        eid, secret = made["endpoint_id"], made["secret"]
        assert secret.startswith("whsec_") and made["test_send"].endswith("/test-send")
        detail = admin.get(f"/api/v1/endpoints/{eid}").json()
        assert detail["url"] == url and detail["event_types"] == ["conversion"]
        assert [s["secret_id"] for s in detail["secrets"]] == [made["secret_id"]]
        assert secret not in admin.get(f"/api/v1/endpoints/{eid}").text  # shown once
        # the test-send link: signed with the new secret, verified by the receiver
        http_json(f"{rbase}/_control/secrets", {eid: [secret]})
        r = admin.post(made["test_send"], body={"override": {"url": f"{rbase}/hooks/{eid}"}})
        assert r.status == 200 and r.json()["ok"], r.text
        [got] = http_json(f"{rbase}/_control/received?endpoint={eid}")
        assert got["signature"] == "ok"

        page = Client(port)
        page.sign_in(token(settings, f"adm2-{ns}", "admin"))
        assert 'id="create-endpoint"' in page.get("/endpoints").text
        r = page.post("/endpoints", form={"app_id": app, "url": "http://internal.test/",
                                          "csrf": page.csrf})
        assert r.status == 422 and "does not resolve to an address postbacks may send to" in r.text
        assert 'value="http://internal.test/"' in r.text
        r = page.post("/endpoints", form={"app_id": app, "url": url, "event_types": "reward",
                                          "csrf": page.csrf})
        assert r.status == 201 and 'id="created-secret">whsec_' in r.text
        assert "/test-send" in r.text
        sup_page = Client(port)
        sup_page.sign_in(token(settings, f"sup2-{ns}", "support"))
        assert 'id="create-endpoint"' not in sup_page.get("/endpoints").text
    assert [a for a, _x in _audited(settings, eid)] == ["endpoint.create",
                                                         "endpoint.test_send"]
    after = _audited(settings, eid)[0][1]
    assert after["app_id"] == app and after["secret_id"] == made["secret_id"]
    assert secret not in json.dumps(after)

    # the CLI: same checks, the secret printed once, audited
    assert run_cli(monkeypatch, settings, "endpoints", "create", "--app", app, "--url",
                   "http://93.184.216.34/hook") == 2  # who: refused before anything
    assert "--actor" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "endpoints", "create", "--app", app, "--url",
                   "http://10.1.2.3/hook", "--actor", "ops") == 1
    assert "10.1.2.3" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "endpoints", "create", "--app", app, "--url",
                   "http://93.184.216.34/hook", "--event-type", "install",
                   "--event-type", "nope", "--actor", "ops") == 1
    assert "unknown event type(s): 'nope'" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "endpoints", "create", "--app", app, "--url",
                   "http://93.184.216.34/hook", "--event-type", "install", "--config",
                   '{"headers": {"X-Api-Key": "k"}}', "--actor", "ops", "--json") == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["secret"].startswith("whsec_")
    assert [a for a, _x in _audited(settings, cli["endpoint_id"])] == ["endpoint.create"]
    # the config (custom header values: credentials) from a file or stdin, not argv
    conf = tmp_path / "config.json"
    conf.write_text('{"headers": {"X-Api-Key": "from-a-file"}}')
    assert run_cli(monkeypatch, settings, "endpoints", "create", "--app", app, "--url",
                   "http://93.184.216.34/file", "--config", f"@{conf}", "--json",
                   "--actor", "ops") == 0
    from_file = json.loads(capsys.readouterr().out)["endpoint_id"]
    monkeypatch.setattr("sys.stdin", io.StringIO('{"headers": {"X-Api-Key": "from-stdin"}}'))
    assert run_cli(monkeypatch, settings, "endpoints", "create", "--app", app, "--url",
                   "http://93.184.216.34/stdin", "--config", "-", "--json",
                   "--actor", "ops") == 0
    from_stdin = json.loads(capsys.readouterr().out)["endpoint_id"]
    with connect(settings.database_url) as conn:
        stored = dict(conn.execute(
            "SELECT endpoint_id, config->'headers'->>'X-Api-Key' FROM endpoints"
            " WHERE endpoint_id = ANY(%s)", ([from_file, from_stdin],)).fetchall())
    assert stored == {from_file: "from-a-file", from_stdin: "from-stdin"}
    assert run_cli(monkeypatch, settings, "endpoints", "create", "--app", app, "--url",
                   "http://93.184.216.34/none", "--config", f"@{tmp_path}/missing.json",
                   "--actor", "ops") == 2
    assert "cannot read" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "endpoints", "disabled") == 0  # still there


def test_headers_saved_before_the_header_check_do_not_block_other_edits(
        settings: Settings, namespace: str) -> None:
    """The header check is for headers being saved: an endpoint stored earlier with a
    non-ASCII value (it still sends) can still be disabled, while saving a header the HTTP
    client sets itself is refused."""
    from replay_console.auth import Principal
    from replay_console.endpoints import save_endpoint

    eid = f"ep_{namespace}_hdr"
    admin = Principal("tok_test", "hdr", "admin", ())
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=eid, app_id=f"app_{namespace}", url="https://x.example/",
                        config=EndpointConfig.from_json({"headers": {"X-Name": "café"}}))
        conn.commit()
        assert save_endpoint(conn, settings, admin, eid, enabled=False, note="t") == []
        problems = save_endpoint(conn, settings, admin, eid, note="t",
                                 config={"headers": {"X-Name": "café", "Host": "y.example"}})
        conn.rollback()
    assert any("'Host' is set by the HTTP client" in p for p in problems), problems
