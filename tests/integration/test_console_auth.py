"""The console's sign-in hardening against the real console and PostgreSQL: failed sign-ins
throttled per client address and per token prefix (429 with Retry-After, a right token
refused too), token expiry, listing and revocation from the CLI (the sessions of a revoked
or expired token end), the bounded audit row of every 403 and 429, and the step-up of an
endpoint URL change (a separate single-use confirmation bound to the principal, the
endpoint and the URL)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import getpass
import hashlib
import json
import time
from typing import Any

import pytest

from postbacks.core.endpoint import EndpointConfig
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Secret, Settings
from replay_console.auth import issue_step_up, lookup_token
from replay_console.throttle import (
    AUDIT_PER_ACTOR,
    LIMIT,
    PREFIX_CHARS,
    RefusalAudit,
    SignInThrottle,
    Throttled,
)
from tests.integration.anomaly_helpers import run_cli
from tests.integration.console_util import Client, console_server, token


def _proxied(settings: Settings) -> Settings:
    """Settings whose console trusts 127.0.0.1 as a proxy, so X-Forwarded-For names the
    client address (the tests' requests all come from 127.0.0.1)."""
    return dataclasses.replace(settings, console_trusted_proxies="127.0.0.1/32",
                               console_session_key=Secret(f"key-{settings.instance_id}"))


def _from(port: int, address: str, bearer: str | None = None) -> tuple[Client, dict[str, str]]:
    return Client(port, bearer=bearer), {"X-Forwarded-For": address}


def _refusals(settings: Settings, actor: str) -> list[tuple[str, dict[str, Any]]]:
    with connect(settings.database_url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT action, after FROM audit_log WHERE actor = %s AND action LIKE 'refused.%%'"
            " ORDER BY audit_id", (actor,))]


def _endpoint(settings: Settings, ns: str) -> str:
    ep = f"ep_{ns}_auth"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{ns}_auth",
                        url=f"https://pub.example/{ep}", config=EndpointConfig())
        conn.commit()
    return ep


def _url(settings: Settings, ep: str) -> str:
    with connect(settings.database_url) as conn:
        row = conn.execute("SELECT url FROM endpoints WHERE endpoint_id = %s", (ep,)).fetchone()
    assert row is not None
    return str(row[0])


# --- throttling -------------------------------------------------------------------------

def test_failed_bearer_sign_ins_are_throttled_per_address(
        settings: Settings, namespace: str) -> None:
    s = _proxied(settings)
    ns = namespace
    good = token(s, f"sup-{ns}", "support")
    attacker, victim = "198.51.100.7", "198.51.100.8"
    with console_server(s) as port:
        for i in range(LIMIT):
            c, h = _from(port, attacker, bearer=f"pbc_{i:04d}_{ns}")
            assert c.get("/api/v1/deliveries", headers=h).status == 401
        # the limit reached: refused before the lookup, a right token too
        c, h = _from(port, attacker, bearer=good)
        r = c.get("/api/v1/deliveries", headers=h)
        assert r.status == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 300
        assert "too many failed sign-ins" in r.json()["error"]
        # the login form from that address as well
        r = Client(port).post("/login", form={"token": good}, headers=h)
        assert r.status == 429 and "retry-after" in r.headers
        assert "too many failed sign-ins" in r.text and "pb_session" not in \
            r.headers.get("set-cookie", "")
        # another address signs in as usual
        c, h = _from(port, victim, bearer=good)
        assert c.get("/api/v1/deliveries", headers=h).status == 200
        r = Client(port).post("/login", form={"token": good}, headers=h)
        assert r.status == 303
    rows = _refusals(s, f"anonymous:{attacker}")
    assert rows, "the 429s were not audited"
    assert {a for a, _ in rows} <= {"refused.deliveries", "refused.login"}
    assert all(after["status"] == 429 and "too many" in after["reason"] for _, after in rows)


def test_failed_sign_ins_are_throttled_per_token_prefix(
        settings: Settings, namespace: str) -> None:
    s = _proxied(settings)
    prefix = f"pbc_{namespace}"[:PREFIX_CHARS]
    with console_server(s) as port:
        for i in range(LIMIT):  # one failure from each of ten addresses, one prefix
            r = Client(port).post("/login", form={"token": f"{prefix}-{i}"},
                                  headers={"X-Forwarded-For": f"203.0.113.{i + 1}"})
            assert r.status == 401 and "unknown, expired or revoked" in r.text
        c, h = _from(port, "203.0.113.99", bearer=f"{prefix}-other")
        r = c.get("/api/v1/deliveries", headers=h)
        assert r.status == 429 and int(r.headers["retry-after"]) >= 1
        # another prefix from a fresh address is only unknown
        c, h = _from(port, "203.0.113.98", bearer="pbc_zzzzzzzz")
        assert c.get("/api/v1/deliveries", headers=h).status == 401


def test_the_throttle_window_passes_and_memory_is_bounded() -> None:
    t = SignInThrottle(limit=3, window_s=60.0, max_keys=5)
    keys = t.keys("192.0.2.1", "pbc_abcdefgh")
    assert keys == ("addr:192.0.2.1", "prefix:pbc_abcd")
    for i in range(3):
        t.check(keys, now=100.0 + i)
        t.failed(keys, now=100.0 + i)
    with pytest.raises(Throttled) as exc:
        t.check(keys, now=110.0)
    assert exc.value.retry_after_s == 50  # until the first failure leaves the window
    with pytest.raises(Throttled):
        t.check(keys, now=159.9)
    t.check(keys, now=160.1)  # the oldest failure has left the window: allowed again
    for i in range(20):
        t.failed(t.keys(f"192.0.2.{i + 10}", f"pbc_{i:08d}"), now=200.0)
    assert len(t) == 5  # capped: the least recently failing keys are forgotten first


def test_refusal_audit_is_bounded_per_actor_action_and_minute() -> None:
    a = RefusalAudit(per_minute=1, anonymous_per_minute=2)
    assert a.admit("anonymous:192.0.2.1", "refused.login", now=60.0)
    assert not a.admit("anonymous:192.0.2.1", "refused.login", now=61.0)
    assert a.admit("anonymous:192.0.2.1", "refused.replay", now=62.0)
    assert not a.admit("anonymous:192.0.2.2", "refused.x", now=62.0)  # anonymous budget
    assert a.admit("support:x", "refused.login", now=63.0)  # not spent by the anonymous
    assert not a.admit("support:y", "refused.login", now=64.0)  # the minute's budget
    assert a.admit("anonymous:192.0.2.1", "refused.login", now=120.0)  # a new minute
    # what the budgets left out is written once, after its minute: per signed-in actor,
    # and the anonymous together
    assert sorted(a.take_unaudited(now=121.0)) == [("anonymous:*", 1, 1), ("support:y", 1, 1)]
    assert a.take_unaudited(now=122.0) == []


def test_a_flood_of_refusals_cannot_blind_the_audit(settings: Settings) -> None:
    """Anonymous refusals from many addresses (on as many paths) used to spend the
    instance's budget, and one actor's harmless refusals its own: the refusals that
    matter that minute went unwritten, and only the log counted them."""
    a = RefusalAudit()
    flood = sum(a.admit(f"anonymous:192.0.2.{i % 17}", "refused.x", 403, "bad csrf",
                        path=f"/x{i}", now=60.0) for i in range(17 * 60))
    assert flood == 17  # one per address: the path does not make another row
    actor = "support:s"
    spent = sum(a.admit(actor, "refused.edit_endpoint", 403, "not yours", path=f"/e/{i}",
                        now=61.0) for i in range(AUDIT_PER_ACTOR))
    assert spent == AUDIT_PER_ACTOR
    assert not a.admit(actor, "refused.edit_endpoint", 403, "not yours", path="/e/x", now=62)
    # the handler marks what matters (a probe of an internal host): written past the budget
    assert a.admit(actor, "refused.test_send", 400, "db.internal is not public", now=62,
                   marked=True)
    assert a.admit("reviewer:r", "refused.replay", 401, "session ended", now=63)
    rows = a.take_unaudited(now=125.0)
    assert rows == [(actor, 1, 1)]
    with connect(settings.database_url) as conn:
        RefusalAudit.write_unaudited(conn, rows)
        got = conn.execute("SELECT actor, action, after FROM audit_log WHERE actor = %s"
                           " AND action = 'refused.unaudited' ORDER BY audit_id DESC LIMIT 1",
                           (actor,)).fetchone()
        conn.rollback()
    assert got == (actor, "refused.unaudited", {"count": 1, "minute_start_s": 60})


def test_refusal_audit_writes_each_reason_and_bounds_each_actor() -> None:
    """One harmless refusal no longer hides the minute's others: probes of internal hosts
    after it are refused for other reasons, each written once; one actor's rows are
    bounded so it cannot spend every other actor's budget."""
    a = RefusalAudit(per_minute=1_000)
    actor = "reviewer:r"
    assert a.admit(actor, "refused.edit_replay", 403, "custom headers to another host", now=60)
    for host in ("db.internal.corp", "vault.internal.corp", "metadata.internal"):
        assert a.admit(actor, "refused.edit_replay", 400, f"{host} is not public", now=61)
        assert not a.admit(actor, "refused.edit_replay", 400, f"{host} is not public", now=62)
    admitted = sum(a.admit(actor, "refused.edit_replay", 400, f"h{i}.internal", now=63)
                   for i in range(AUDIT_PER_ACTOR * 2))
    assert admitted == AUDIT_PER_ACTOR - 4  # its cap, the four rows above included
    assert a.admit("support:s", "refused.edit_replay", 400, "h0.internal", now=64)
    # a 429 says how long to wait, another number each second: still the same refusal
    assert a.admit("support:s", "refused.test_send", 429, "too many: try again in 9 s", now=65)
    assert not a.admit("support:s", "refused.test_send", 429, "too many: try again in 8 s",
                       now=66)
    # the same refusal on another path (another delivery probed) is a row of its own
    pub = "publisher:p"
    assert a.admit(pub, "refused.replay", 404, "no such delivery", path="/d/dlv_1", now=67)
    assert not a.admit(pub, "refused.replay", 404, "no such delivery", path="/d/dlv_1", now=68)
    assert a.admit(pub, "refused.replay", 404, "no such delivery", path="/d/dlv_2", now=68)


def test_every_403_is_audited_once_a_minute(settings: Settings, namespace: str) -> None:
    ns = namespace
    ep = _endpoint(settings, ns)
    with console_server(settings) as port:
        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", (f"app_{ns}_auth",)))
        started = time.time()
        for _ in range(3):
            r = pub.post(f"/api/v1/deliveries/dlv_{ns}_1/replay", body={})
            assert r.status == 403
        ended = time.time()
        # the CSRF refusal of a cookie session: no action named yet, the route is
        page = Client(port)
        page.sign_in(token(settings, f"adm-{ns}", "admin"))
        r = page.post(f"/endpoints/{ep}", form={"url": "https://x.test/"})
        assert r.status == 403 and "CSRF" in r.text
    rows = _refusals(settings, f"publisher:pub-{ns}")
    if int(started // 60) == int(ended // 60):
        assert len(rows) == 1, rows
    assert 1 <= len(rows) <= 2
    action, after = rows[0]
    assert action == "refused.replay"
    assert after["status"] == 403 and "may not replay" in after["reason"]
    rows = _refusals(settings, f"admin:adm-{ns}")
    assert [(a, x["status"]) for a, x in rows] == [("refused.endpoints_id", 403)]
    assert "CSRF" in rows[0][1]["reason"]


# --- token expiry, list, revoke ---------------------------------------------------------

def _cli_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              settings: Settings, *argv: str) -> Any:
    capsys.readouterr()
    assert run_cli(monkeypatch, settings, *argv) == 0
    return json.loads(capsys.readouterr().out)


def test_tokens_expire_and_are_listed_and_revoked_from_the_cli(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    ns = namespace
    made = _cli_json(monkeypatch, capsys, settings, "console", "token", "create",
                     "--name", f"alice-{ns}", "--role", "support", "--expires-in", "30d",
                     "--json")
    expires = dt.datetime.fromisoformat(made["expires_at"])
    left = (expires - dt.datetime.now(dt.UTC)).total_seconds()
    assert 30 * 86400 - 120 < left <= 30 * 86400
    default = _cli_json(monkeypatch, capsys, settings, "console", "token", "create",
                        "--name", f"bob-{ns}", "--role", "reviewer", "--json")
    left = (dt.datetime.fromisoformat(default["expires_at"]) - dt.datetime.now(dt.UTC))
    assert 89 * 86400 < left.total_seconds() <= 90 * 86400
    with connect(settings.database_url) as conn:  # no --by: the account's login name
        assert conn.execute(
            "SELECT actor FROM audit_log WHERE action = 'console.token_create'"
            " AND target_id = %s", (default["token_id"],)).fetchall() == [
                (f"cli:{getpass.getuser()}",)]
    forever = _cli_json(monkeypatch, capsys, settings, "console", "token", "create",
                        "--name", f"carol-{ns}", "--role", "admin", "--expires-in", "never",
                        "--json")
    assert forever["expires_at"] is None
    assert run_cli(monkeypatch, settings, "console", "token", "create", "--name", "x",
                   "--role", "support", "--expires-in", "soon") == 2

    with console_server(settings) as port:
        api = Client(port, bearer=made["token"])
        assert api.get("/api/v1/deliveries").status == 200
        page = Client(port)
        page.sign_in(made["token"])
        assert page.get("/api/v1/deliveries").status == 200
        listed = _cli_json(monkeypatch, capsys, settings, "console", "token", "list", "--json")
        mine = {t["token_id"]: t for t in listed["tokens"]}
        row = mine[made["token_id"]]
        assert (row["name"], row["role"], row["state"]) == (f"alice-{ns}", "support", "active")
        assert row["last_used_at"] is not None and row["expires_at"] is not None
        assert mine[forever["token_id"]]["expires_at"] is None

        # revoked from the CLI (audited): the bearer and the session are refused
        capsys.readouterr()
        assert run_cli(monkeypatch, settings, "console", "token", "revoke", made["token_id"],
                       "--by", f"ops-{ns}", "--note", "left the team") == 0
        with connect(settings.database_url) as conn:  # never taken for a console user's
            assert conn.execute(
                "SELECT actor FROM audit_log WHERE action = 'console.token_revoke'"
                " AND target_id = %s", (made["token_id"],)).fetchall() == [(f"cli:ops-{ns}",)]
        assert api.get("/api/v1/deliveries").status == 401
        r = page.get("/api/v1/deliveries")
        assert r.status == 401 and "has ended" in r.json()["error"]
        r = page.get("/deliveries")
        assert r.status == 303 and r.headers["location"].startswith("/login")
        with connect(settings.database_url) as conn:  # a revoked user's cookie in use
            ended = conn.execute(
                "SELECT action, after->>'status' FROM audit_log WHERE action LIKE 'refused.%%'"
                " AND after->>'reason' LIKE %s", (f"%{made['token_id']}%",)).fetchall()
        assert ("refused.deliveries", "401") in ended, ended
        assert run_cli(monkeypatch, settings, "console", "token", "revoke",
                       made["token_id"]) == 1  # already revoked
        listed = _cli_json(monkeypatch, capsys, settings, "console", "token", "list", "--json")
        assert made["token_id"] not in {t["token_id"] for t in listed["tokens"]}
        listed = _cli_json(monkeypatch, capsys, settings, "console", "token", "list", "--all",
                           "--json")
        assert {t["token_id"]: t["state"] for t in listed["tokens"]}[made["token_id"]] == \
            "revoked"

        # expired: the bearer, a sign-in and an open session are refused
        api2 = Client(port, bearer=default["token"])
        page2 = Client(port)
        page2.sign_in(default["token"])
        assert api2.get("/api/v1/deliveries").status == 200
        with connect(settings.database_url) as conn:
            conn.execute("UPDATE console_tokens SET expires_at = now() - interval '1 second'"
                         " WHERE token_id = %s", (default["token_id"],))
            conn.commit()
        assert api2.get("/api/v1/deliveries").status == 401
        assert page2.get("/api/v1/deliveries").status == 401
        r = Client(port).post("/login", form={"token": default["token"]})
        assert r.status == 401 and "expired" in r.text
        listed = _cli_json(monkeypatch, capsys, settings, "console", "token", "list", "--all",
                           "--json")
        assert {t["token_id"]: t["state"] for t in listed["tokens"]}[default["token_id"]] == \
            "expired"
    with connect(settings.database_url) as conn:
        audit = conn.execute(
            "SELECT actor, action, note FROM audit_log WHERE target_id = %s ORDER BY audit_id",
            (made["token_id"],)).fetchall()
    assert [(a, b) for a, b, _ in audit] == [(f"cli:{getpass.getuser()}", "console.token_create"),
                                             (f"support:alice-{ns}", "console.login"),
                                             (f"cli:ops-{ns}", "console.token_revoke")]
    assert audit[2][2] == "left the team"


# --- step-up for a URL change -----------------------------------------------------------

def _lookup(_host: str) -> list[str]:
    return ["93.184.216.34"]


def test_a_url_change_needs_a_separate_single_use_confirmation(
        settings: Settings, namespace: str) -> None:
    s = _proxied(settings)
    ns = namespace
    ep = _endpoint(s, ns)
    path = f"/api/v1/endpoints/{ep}"
    adm_tok = token(s, f"adm-{ns}", "admin")
    other_tok = token(s, f"adm2-{ns}", "admin")
    with console_server(s, lookup=_lookup) as port:
        admin, other = Client(port, bearer=adm_tok), Client(port, bearer=other_tok)
        r = admin.post(path, body={"url": "https://moved.test/a"})
        assert r.status == 409, r.text
        body = r.json()
        assert body["step_up"] is True and body["expires_in_s"] == 300
        code = body["confirmation"]
        assert code.startswith("stp_") and adm_tok not in code
        assert _url(s, ep) == f"https://pub.example/{ep}"  # nothing saved yet
        # the sign-in token again is not a confirmation
        r = admin.post(path, body={"url": "https://moved.test/a", "confirmation": adm_tok})
        assert r.status == 403
        # bound to the URL, the principal and the endpoint
        r = admin.post(path, body={"url": "https://moved.test/b", "confirmation": code})
        assert r.status == 403 and r.json()["step_up"] is True
        r = other.post(path, body={"url": "https://moved.test/a", "confirmation": code})
        assert r.status == 403
        # expired (issued more than five minutes ago with the console's key)
        key = hashlib.sha256(b"postbacks-console-session|"
                             + s.console_session_key.reveal().encode()).digest()
        with connect(s.database_url) as conn:
            p = lookup_token(conn, adm_tok)
            conn.commit()
        assert p is not None
        stale = issue_step_up(key, p, ep, "https://moved.test/a", now_s=time.time() - 301)
        r = admin.post(path, body={"url": "https://moved.test/a", "confirmation": stale})
        assert r.status == 403
        assert _url(s, ep) == f"https://pub.example/{ep}"
        # the right one, once
        r = admin.post(path, body={"url": "https://moved.test/a", "confirmation": code,
                                   "note": "publisher moved"})
        assert r.status == 200, r.text
        assert _url(s, ep) == "https://moved.test/a"
        r = admin.post(path, body={"url": "https://moved.test/b", "confirmation": code})
        assert r.status == 403
        r = admin.post(path, body={"url": "https://moved.test/a"})
        assert r.status == 200  # no change of URL: nothing to confirm

        # the page flow: save shows the confirmation, confirming saves
        page = Client(port)
        page.sign_in(adm_tok)
        r = page.post(f"/endpoints/{ep}", form={"url": "https://moved.test/page",
                                                "event_types": "", "config": "{}",
                                                "csrf": page.csrf})
        assert r.status == 409 and 'id="confirm-url-change"' in r.text, r.text
        assert _url(s, ep) == "https://moved.test/a"
        form = dict(
            (m.split('name="')[1].split('"')[0], m.split('value="')[1].split('"')[0])
            for m in r.text.split('<fieldset id="step-up">')[1].split("</fieldset>")[0]
            .split("<input")[1:])
        assert form["url"] == "https://moved.test/page" and form["confirmation"]
        r = page.post(f"/endpoints/{ep}", form=form)
        assert r.status == 303, r.text
        assert _url(s, ep) == "https://moved.test/page"
        r = page.post(f"/endpoints/{ep}", form={**form, "url": "https://moved.test/a"})
        assert r.status == 403  # spent
    with connect(s.database_url) as conn:
        actions = [r[0] for r in conn.execute(
            "SELECT action FROM audit_log WHERE target_id = %s ORDER BY audit_id", (ep,))]
    assert actions == ["endpoint.update", "endpoint.update"]
