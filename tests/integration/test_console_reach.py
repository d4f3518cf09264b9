"""The console's reach against real PostgreSQL and a real receiver: support may test-send
or edit-and-replay only to the endpoint's own host or its ``test_hosts`` (another host is
a 403, audited), and change neither's query; a reviewer may target any host that passes
the SSRF check, but only an admin may send an endpoint's custom headers there; nobody
sends an https endpoint's request over http; the role's checks come before the URL's DNS
lookup; and no signature made with the endpoint's live secret appears in what the
test-send answers, on its page or in the audit log."""

from __future__ import annotations

import json
import time
from typing import Any

from postbacks.core.endpoint import EndpointConfig
from postbacks.core.signing import decode_secret, generate_secret, sign
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, upsert_endpoint
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from tests.integration.console_util import Client, console_server, token


def _lookup(host: str) -> list[str]:
    host = host.lower()
    if host in ("own.test", "allowed.test", "other.test"):
        return ["127.0.0.1"]  # the receiver, on loopback (the test settings allow it)
    if host == "internal.test":
        return ["10.1.2.3"]
    raise OSError("name does not resolve")


def _refusals(settings: Settings, actor: str) -> list[tuple[str, str, Any]]:
    with connect(settings.database_url) as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(
            "SELECT action, target_id, after FROM audit_log WHERE actor = %s"
            " AND action LIKE 'refused.%%' ORDER BY audit_id", (actor,))]


def _live_signature(live: str, sent: dict[str, Any]) -> str:
    """The signature the live secret makes over the request the console says it sent,
    without its ``v1,`` (the value itself must appear nowhere)."""
    h = sent["request"]["headers"]
    sig = sign(decode_secret(live), h["webhook-id"], int(h["webhook-timestamp"]),
               sent["request"]["body"].encode())
    return sig.removeprefix("v1,")


def test_support_reaches_only_the_endpoints_own_and_listed_hosts(
        settings: Settings, namespace: str, stack: Any) -> None:
    from postbacks.tools.procs import free_port, http_json, wait_for

    ns = namespace
    app, ep = f"app_{ns}", f"ep_{ns}"
    rport = free_port()
    stack.start("receiver", "receiver", "--port", str(rport))
    rbase = f"http://127.0.0.1:{rport}"
    wait_for(lambda: http_json(f"{rbase}/_control/stats"), 30, what="receiver")
    live = generate_secret()
    http_json(f"{rbase}/_control/secrets", {ep: [live]})  # the receiver verifies with it
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app,
                        url=f"http://own.test:{rport}/hooks/{ep}",
                        config=EndpointConfig.from_json({"test_hosts": ["Allowed.Test"]}))
        add_secret(conn, SecretBox(settings.secrets_key.reveal()), ep, live,
                   now_ms=int(time.time() * 1000))
        conn.commit()
    for n in (1, 2, 3):
        insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep, app=app)],
                          status="dead_lettered")
    other = f"http://other.test:{rport}/hooks/{ep}"
    send = f"/api/v1/endpoints/{ep}/test-send"
    with console_server(settings, lookup=_lookup) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        rev = Client(port, bearer=token(settings, f"rev-{ns}", "reviewer"))

        # support, another host: refused with the reason, nothing sent
        r = sup.post(send, body={"override": {"url": other}})
        assert r.status == 403, r.text
        err = r.json()["error"]
        assert "other.test" in err and "reviewer" in err and "allowed.test" in err, err
        assert http_json(f"{rbase}/_control/stats")["per_endpoint"].get(ep, 0) == 0
        # a test-send, like an edit & replay, may not change what the receiver is told
        r = sup.post(send, body={"override": {"url": f"http://own.test:{rport}/hooks/{ep}?x=1"}})
        assert r.status == 403 and "query" in r.json()["error"], r.text
        # the SSRF check, for every role that may send there
        r = rev.post(send, body={"override": {"url": "http://internal.test/x"}})
        assert r.status == 400, r.text
        assert "does not resolve to an address postbacks may send to" in r.json()["error"]
        assert "10.1.2.3" not in r.text  # no name mapping through the console

        # support, the endpoint's own host (stored URL, or typed with another case) and
        # an allow-listed host: sent, signed with the live secret
        lives: list[str] = []  # every signature the live secret made for these sends
        answers = [sup.post(send, body={})]
        for url in (f"http://OWN.test:{rport}/hooks/{ep}",
                    f"http://allowed.test:{rport}/hooks/{ep}"):
            answers.append(sup.post(send, body={"override": {"url": url}}))
        # a reviewer, another host: allowed
        answers.append(rev.post(send, body={"override": {"url": other}}))
        for r in answers:
            assert r.status == 200, r.text
            sent = r.json()
            assert sent["ok"] and sent["response"]["status"] == 200, sent
            shown = sent["request"]["headers"]["webhook-signature"]
            assert shown == "v1,[redacted]", shown
            lives.append(_live_signature(live, sent))
            assert lives[-1] not in r.text
        assert answers[-1].json()["request"]["url"] == other
        got = http_json(f"{rbase}/_control/received?endpoint={ep}")
        assert [g["signature"] for g in got] == ["ok"] * 4  # the receiver got live signatures

        # the page: the same redaction, the same refusal
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        t0 = int(time.time())
        html = page.post(f"/endpoints/{ep}/test-send", form={"csrf": page.csrf})
        t1 = int(time.time())
        assert html.status == 200 and "v1,[redacted]" in html.text, html.text
        [last] = http_json(f"{rbase}/_control/received?endpoint={ep}")[-1:]
        assert last["signature"] == "ok" and last["webhook_id"] in html.text
        # the live signature over what the page's send carried, at any second it could
        # have been stamped with
        key = decode_secret(live)
        page_lives = [sign(key, last["webhook_id"], ts, last["body"].encode()).removeprefix("v1,")
                      for ts in range(t0 - 1, t1 + 2)]
        assert not [x for x in page_lives if x in html.text]
        lives += page_lives
        r = page.post(f"/endpoints/{ep}/test-send", form={"csrf": page.csrf, "url": other})
        assert r.status == 403 and "needs a reviewer" in r.text

        # edit & replay: the same reach
        path = f"/api/v1/deliveries/dlv_{ns}_1/replay"
        r = sup.post(path, body={"override": {"url": other}})
        assert r.status == 403 and "other.test" in r.json()["error"], r.text
        r = page.post(f"/deliveries/dlv_{ns}_2/replay", form={"csrf": page.csrf, "url": other})
        assert r.status == 403 and "needs a reviewer" in r.text  # the diff page too
        r = sup.post(path, body={"override": {"url": f"https://allowed.test/{ep}"}})
        assert r.status == 202, r.text
        r = rev.post(f"/api/v1/deliveries/dlv_{ns}_3/replay",
                     body={"override": {"url": "https://other.test/moved"}})
        assert r.status == 202, r.text

    # refusals are audited (403 by the middleware, a target the SSRF check refuses too),
    # with the reason
    [(action, _t, why)] = _refusals(settings, f"reviewer:rev-{ns}")
    assert action == "refused.test_send" and why["status"] == 400, why
    assert "does not resolve to an address postbacks may send to" in why["reason"]
    # one row per refusal and reason a minute: a repeat is not written again, a refusal
    # naming another target is
    refused = _refusals(settings, f"support:sup-{ns}")
    assert list(dict.fromkeys((a, t) for a, t, _ in refused)) == [
        ("refused.test_send", send), ("refused.edit_replay", path)], refused
    reasons = [(a, why["reason"]) for a, _t, why in refused]
    assert len(reasons) == len(set(reasons)), reasons
    assert refused[0][2]["status"] == 403 and "other.test" in refused[0][2]["reason"]
    assert list(dict.fromkeys(a for a, _t, _ in _refusals(settings, f"support:sup2-{ns}"))) \
        == ["refused.test_send", "refused.edit_replay"]
    with connect(settings.database_url) as conn:
        rows = conn.execute("SELECT after FROM audit_log WHERE target_id = %s", (ep,)).fetchall()
        edits = conn.execute("SELECT count(*) FROM replay_items WHERE delivery_id = ANY(%s)",
                             ([f"dlv_{ns}_{n}" for n in (1, 2, 3)],)).fetchone()
    audited = json.dumps([r[0] for r in rows])
    assert len(rows) == 5 and not [x for x in lives if x in audited], audited
    assert edits == (2,)  # the allowed support edit and the reviewer's


def test_test_hosts_is_validated_on_save(settings: Settings, namespace: str) -> None:
    ns = namespace
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=f"ep_{ns}", app_id=f"app_{ns}",
                        url="https://own.test/h", config=EndpointConfig())
        conn.commit()
    with console_server(settings, lookup=_lookup) as port:
        admin = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        path = f"/api/v1/endpoints/ep_{ns}"
        for bad, words in (("https://x.test/", "not a host name"), ("x.test:8080", "port"),
                           ("", "non-empty"), (7, "non-empty")):
            r = admin.post(path, body={"config": {"test_hosts": [bad]}})
            assert r.status == 422 and words in json.dumps(r.json()["problems"]), (bad, r.text)
        r = admin.post(path, body={"config": {"test_hosts": ["Staging.Test.", "10.0.0.1"]}})
        assert r.status == 200, r.text
        assert admin.get(path).json()["config"]["test_hosts"] == ["staging.test", "10.0.0.1"]


def test_support_may_retarget_an_edit_but_not_change_what_the_receiver_is_told(
        settings: Settings, namespace: str) -> None:
    """A replay is signed with the live secret and skips the anomaly gate: support may move
    it to an allowed host, but a literal payout in the query, a path without the
    template's macros, or fields and aliases need a reviewer (403, audited)."""
    ns = namespace
    app, ep = f"app_{ns}", f"ep_{ns}"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, provider="v2",
                        url="https://own.test/cb/{conversion_id}?p={payout_usd}",
                        config=EndpointConfig.from_json({"test_hosts": ["allowed.test"]}))
        conn.commit()
    for n in (1, 2):
        insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep, app=app)],
                          status="dead_lettered")
    path = f"/api/v1/deliveries/dlv_{ns}_1/replay"
    with console_server(settings, lookup=_lookup) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        for override, words in [
            ({"url": "https://own.test/cb/{conversion_id}?p=99999.00"}, "query"),
            ({"url": "https://allowed.test/cb/123?p={payout_usd}"}, "path"),
            ({"url": "https://own.test/cb/{conversion_id}/{conversion_id}?p={payout_usd}"},
             "path"),  # a macro repeated: the same names, not the same places
            # a literal before a macro in its segment, or a segment among the macros, is
            # what a receiver reading values by position takes: the path from the first
            # macro's segment on stays as it is
            ({"url": "https://own.test/cb/9999.00;{conversion_id}?p={payout_usd}"}, "path"),
            ({"url": "https://own.test/cb/{conversion_id}/9999?p={payout_usd}"}, "path"),
            ({"url": "https://own.test/cb;amount=9999/{conversion_id}?p={payout_usd}"},
             "path"),  # Spring and Tomcat drop what follows ';' in a segment
            ({"url": "https://own.test/cb%2F9999/{conversion_id}?p={payout_usd}"}, "path"),
            ({"aliases": {"occurred_at": "payout_usd"}}, "aliases"),
            ({"fields": ["conversion_id"]}, "fields"),
            ({"url": "http://own.test/cb/{conversion_id}?p={payout_usd}"}, "plain http"),
        ]:
            r = sup.post(path, body={"override": override})
            assert r.status == 403 and words in r.json()["error"], (override, r.text)
        for broken in ("https://own.test/cb/{conversion_id?p={payout_usd}",
                       "http://[own.test/cb"):  # refused by the edit's own check: a 400
            r = sup.post(path, body={"override": {"url": broken}})
            assert r.status == 400, (broken, r.text)
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        r = page.post(f"/deliveries/dlv_{ns}_1/replay", form={
            "csrf": page.csrf, "url": "https://own.test/cb/{conversion_id}?p=1"})
        assert r.status == 403 and "query" in r.text  # the diff page too
        r = sup.post(path, body={"override": {
            "url": "https://allowed.test/v2/cb/{conversion_id}?p={payout_usd}"}})
        assert r.status == 202, r.text
        rev = Client(port, bearer=token(settings, f"rev-{ns}", "reviewer"))
        r = rev.post(f"/api/v1/deliveries/dlv_{ns}_2/replay", body={"override": {
            "url": "https://other.test/cb/{conversion_id}?p={payout_usd}&src=fix"}})
        assert r.status == 202, r.text
    # every refusal for another reason is audited (one harmless refusal used to hide the
    # rest of its minute's), each once
    refused = _refusals(settings, f"support:sup-{ns}")
    assert {a for a, _t, _ in refused} == {"refused.edit_replay"}, refused
    reasons = [why["reason"] for _a, _t, why in refused]
    assert len(reasons) == len(set(reasons)) >= 5, reasons
    assert "query" in reasons[0]
    assert any("from its first macro on" in r for r in reasons), reasons
    assert any("';' or an encoded slash" in r for r in reasons), reasons


def test_no_downgrade_to_http_headers_only_by_an_admin_and_no_lookup_before_reach(
        settings: Settings, namespace: str) -> None:
    ns = namespace
    app, ep = f"app_{ns}", f"ep_{ns}"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url="https://own.test/hooks",
                        config=EndpointConfig.from_json(
                            {"headers": {"Authorization": "Bearer publisher-key"}}))
        add_secret(conn, SecretBox(settings.secrets_key.reveal()), ep, generate_secret(),
                   now_ms=int(time.time() * 1000))
        conn.commit()
    for n in (1, 2):
        insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep, app=app)],
                          status="dead_lettered")
    looked_up: list[str] = []

    def lookup(host: str) -> list[str]:
        looked_up.append(host.lower())
        return _lookup(host)

    send = f"/api/v1/endpoints/{ep}/test-send"
    replay = f"/api/v1/deliveries/dlv_{ns}_1/replay"
    with console_server(settings, lookup=lookup) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        rev = Client(port, bearer=token(settings, f"rev-{ns}", "reviewer"))
        adm = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        # https -> http with the custom headers: nobody, not even an admin
        for client in (sup, rev, adm):
            for path in (send, replay):
                r = client.post(path, body={"override": {"url": "http://own.test/hooks"}})
                assert r.status == 403 and "Authorization" in r.json()["error"], r.text
        # the custom headers to another path or port of its host (one host may serve many
        # tenants, a path each): an admin only
        for client in (sup, rev):
            for path in (send, replay):
                for url in ("https://own.test/hooks-of-another-tenant",
                            "https://own.test:8443/hooks"):
                    r = client.post(path, body={"override": {"url": url}})
                    assert r.status == 403 and "another path or port" in r.json()["error"], \
                        r.text
        # the custom headers to another host: an admin only
        for path in (send, replay):
            r = rev.post(path, body={"override": {"url": "https://other.test/hooks"}})
            assert r.status == 403 and "Authorization" in r.json()["error"], r.text
        r = adm.post(f"/api/v1/deliveries/dlv_{ns}_2/replay",
                     body={"override": {"url": "https://other.test/hooks"}})
        assert r.status == 202, r.text
        # support, a name it may not send to: refused before any DNS lookup, so the
        # console maps no internal names for it
        looked_up.clear()
        for path in (send, replay):
            r = sup.post(path, body={"override": {"url": "https://internal.test/x"}})
            assert r.status == 403 and "needs a reviewer" in r.json()["error"], r.text
        page = Client(port)  # the page's first step: the edit's diff
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        r = page.post(f"/deliveries/dlv_{ns}_1/replay",
                      form={"csrf": page.csrf, "url": "https://internal.test/x"})
        assert r.status == 403 and "needs a reviewer" in r.text, r.text
        assert looked_up == [], looked_up
    assert http_sent_nothing(settings, ep)


def http_sent_nothing(settings: Settings, ep: str) -> bool:
    """No test-send of ``ep`` was audited as sent (every one above was refused)."""
    with connect(settings.database_url) as conn:
        row = conn.execute("SELECT count(*) FROM audit_log WHERE target_id = %s"
                           " AND action = 'test_send'", (ep,)).fetchone()
    return row is not None and row[0] == 0
