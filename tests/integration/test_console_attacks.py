"""The console attacked as a hostile user or an outsider would, against the real console,
PostgreSQL and Kafka: every protected route without a credential, every state-changing
route under a role without the right and under a cookie without its CSRF token, stored
and reflected markup, injection in filters and paging, traversal of the static files,
open redirects, a replay of the same delivery queued twice (one after the other and at
once), unbounded replays, oversized requests, the CLI's help and bad arguments, and the
audit row (who, when, what) of every state-changing action."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import socket
import threading
import time
import uuid
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import pytest
from psycopg.types.json import Jsonb

from postbacks.core.endpoint import EndpointConfig
from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Secret, Settings
from replay_console.auth import session_cookie
from replay_console.web import make_app
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries, run_cli
from tests.integration.console_util import Client, console_server, insert_dead_letter, token
from tests.integration.test_console_api import _drain, _world
from tests.kafka_util import decode, read_topic
from topics import TOPICS

RETRY_5S = TOPICS.retry_tier("5s").base


def _public_lookup(_host: str) -> list[str]:
    return ["93.184.216.34"]


def _keyed(settings: Settings) -> Settings:
    """Settings with a known session key, so a test can forge what an attacker would."""
    return dataclasses.replace(settings,
                               console_session_key=Secret(f"key-{settings.instance_id}"))


def _key(settings: Settings) -> bytes:
    return hashlib.sha256(b"postbacks-console-session|"
                          + settings.console_session_key.reveal().encode()).digest()


def _post_routes(settings: Settings) -> list[str]:
    """Every POST path template the app serves, from its router (a new route is covered
    without touching this test)."""
    out = {route.resource.canonical for route in make_app(settings).router.routes()
           if route.method == "POST" and route.resource is not None}
    return sorted(out)


def _fill(template: str, w: dict[str, Any], ns: str) -> str:
    """A POST template with ids of this test's world."""
    if "{id}" not in template:
        return template
    if "/endpoints/" in template:
        return template.replace("{id}", w["ep_a"])
    if "/dead-letters/" in template:
        return template.replace("{id}", f"dl_{ns}")
    return template.replace("{id}", f"dlv_{ns}_5")


def _dead_letter(settings: Settings, ns: str, w: dict[str, Any], *,
                 suppressed: bool = False) -> None:
    """``dl_{ns}`` for delivery 5; with ``suppressed``, delivery 8 suppressed as well."""
    insert_dead_letter(settings, ns, w["ep_a"])
    if suppressed:
        with connect(settings.database_url) as conn:
            conn.execute("INSERT INTO postback_suppressions (delivery_id, endpoint_id,"
                         " reason) VALUES (%s, %s, 'poison')", (f"dlv_{ns}_8", w["ep_b"]))
            conn.commit()


def _actions_by(settings: Settings, actors: list[str]) -> list[tuple[str, str]]:
    with connect(settings.database_url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT actor, action FROM audit_log WHERE actor = ANY(%s) ORDER BY audit_id",
            (actors,))]


def _state(settings: Settings, ns: str, w: dict[str, Any]) -> dict[str, Any]:
    """What a refused request must leave as it was."""
    with connect(settings.database_url) as conn:
        def one(sql: str, *args: Any) -> Any:
            row = conn.execute(sql, args).fetchone()
            return None if row is None else tuple(row)
        return {
            "endpoint": one("SELECT url, config, event_types FROM endpoints"
                            " WHERE endpoint_id = %s", w["ep_a"]),
            "endpoints": one("SELECT count(*) FROM endpoints WHERE app_id = %s", w["a"]),
            "secrets": one("SELECT count(*) FROM endpoint_secrets WHERE endpoint_id = %s",
                           w["ep_a"]),
            "jobs": one("SELECT count(*) FROM replay_items WHERE delivery_id LIKE %s",
                        f"dlv_{ns}_%"),
            "suppressions": one("SELECT count(*), count(resolved_at) FROM"
                                " postback_suppressions WHERE delivery_id LIKE %s",
                                f"dlv_{ns}_%"),
            "dead_letter": one("SELECT resolved_at FROM dead_letters WHERE dead_letter_id = %s",
                               f"dl_{ns}"),
            "statuses": one("SELECT array_agg(status ORDER BY delivery_id) FROM deliveries"
                            " WHERE delivery_id LIKE %s", f"dlv_{ns}_%"),
            "held_audit": one("SELECT count(*) FROM audit_log WHERE target_id LIKE %s"
                              " AND action LIKE 'held.%%'", f"dlv_{ns}_%"),
        }


# --- authentication ---------------------------------------------------------------------

def test_no_protected_route_answers_without_a_valid_credential(
        settings: Settings, namespace: str) -> None:
    """Every route but /login, /healthz, /metrics and /static/ refuses a request with no
    credential, an empty or malformed bearer, an empty, forged, expired, other-key or
    revoked session cookie; a path dressed as a public one reaches nothing."""
    # 127.0.0.1 is a trusted proxy: each unknown bearer comes from an address of its own,
    # so the failed sign-in throttle (tested apart) does not answer 429 instead of 401
    s = dataclasses.replace(_keyed(settings), console_trusted_proxies="127.0.0.1/32")
    ns = namespace
    w = _world(s, ns)
    _dead_letter(s, ns, w)
    before = _state(s, ns, w)
    token(s, f"sup-{ns}", "support")
    with connect(s.database_url) as conn:
        row = conn.execute("SELECT token_id FROM console_tokens WHERE name = %s",
                           (f"sup-{ns}",)).fetchone()
    assert row is not None
    tid = str(row[0])
    key = _key(s)
    routes: set[tuple[str, str]] = set()
    for route in make_app(s).router.routes():
        res = route.resource
        if res is None or res.canonical.startswith("/static") or route.method == "HEAD":
            continue
        if res.canonical in ("/login", "/healthz", "/metrics"):
            continue
        path = _fill(res.canonical, w, ns).replace("{job}", f"rpl_{ns}")
        routes.add((route.method, path))
    assert len(routes) > 40, routes
    creds: list[tuple[str, dict[str, str]]] = [
        ("none", {}),
        ("empty bearer", {"Authorization": "Bearer "}),
        ("bearer without a token", {"Authorization": "Bearer"}),
        ("unknown bearer", {"Authorization": "Bearer pbc_"}),  # made unique below
        ("basic", {"Authorization": "Basic " + "YWRtaW46YWRtaW4="}),
        ("empty cookie", {"Cookie": "pb_session="}),
        ("forged cookie", {"Cookie": "pb_session=" + session_cookie(b"\0" * 32, tid)}),
        ("expired cookie", {"Cookie": "pb_session=" + session_cookie(
            key, tid, now_s=time.time() - 9 * 3600)}),
        ("signature cut", {"Cookie": "pb_session=" + session_cookie(key, tid)[:-1]}),
        ("token id swapped", {"Cookie": "pb_session=" + session_cookie(key, tid).replace(
            tid, "tok_" + "0" * 26, 1)}),
    ]
    with console_server(s) as port:
        good = Client(port, cookie=session_cookie(key, tid))
        assert good.get("/api/v1/deliveries").status == 200  # the forged cookies' control
        for what, headers in creds:
            anon = Client(port)
            for i, (method, path) in enumerate(sorted(routes)):
                if what == "unknown bearer":
                    headers = {"Authorization": f"Bearer pbc_{uuid.uuid4().hex}",
                               "X-Forwarded-For": f"198.18.{i // 200}.{i % 200 + 1}"}
                r = anon.request(method, path, headers=headers,
                                 body={"reason": "x", "delivery_ids": [f"dlv_{ns}_5"]}
                                 if method == "POST" else None)
                if path.startswith("/api/"):
                    assert r.status == 401, (what, method, path, r.status, r.text[:200])
                elif method == "GET":
                    assert r.status == 303 and r.headers["location"].startswith(
                        "/login?next="), (what, method, path, r.status)
                else:
                    assert r.status == 401, (what, method, path, r.status)
        # public-looking paths that name a protected one
        for path in ("/static/../api/v1/deliveries", "/static/%2e%2e/api/v1/deliveries",
                     "/static/..%2fapi/v1/deliveries", "/login/../api/v1/deliveries",
                     "/healthz/../api/v1/held", "/metrics/%2e%2e/api/v1/audit",
                     "//api/v1/deliveries", "/API/v1/deliveries"):
            r = Client(port).get(path)
            assert r.status in (303, 401, 404), (path, r.status)
            assert '"deliveries"' not in r.text and "dlv_" not in r.text, path
    assert _state(s, ns, w) == before


def test_sign_in_always_issues_a_fresh_session(settings: Settings, namespace: str) -> None:
    """Session fixation: a cookie planted before sign-in (the attacker's own session) is
    replaced by one for the token that signs in; it never carries the new rights."""
    ns = namespace
    with console_server(settings) as port:
        attacker = Client(port)
        attacker.sign_in(token(settings, f"pub-{ns}", "publisher", (f"app_{ns}",)))
        planted = attacker.cookie
        assert planted
        victim = Client(port, cookie=planted)
        r = victim.post("/login", form={"token": token(settings, f"adm-{ns}", "admin")})
        assert r.status == 303 and victim.cookie and victim.cookie != planted
        assert victim.get("/api/v1/audit").status == 200  # the admin's own session
        assert Client(port, cookie=planted).get("/api/v1/audit").status == 403
        # a cookie value the console never issued is no session at all
        r = Client(port, cookie=f"tok_{ns}.{int(time.time()) + 3600}.{'0' * 40}").get(
            "/api/v1/deliveries")
        assert r.status == 401


# --- rights -------------------------------------------------------------------------------

def test_no_role_does_what_it_has_no_right_to(settings: Settings, namespace: str) -> None:
    """Every state-changing request of the API, made by each role that lacks the right:
    refused (403, or 404 where a publisher must not learn the page exists), nothing changed
    and nothing audited but the refusal."""
    ns = namespace
    w = _world(settings, ns)
    _dead_letter(settings, ns, w, suppressed=True)
    before = _state(settings, ns, w)
    ep = f"/api/v1/endpoints/{w['ep_a']}"
    held = {"delivery_ids": [f"dlv_{ns}_3"], "note": "x"}
    # (path, body, {role: status})
    pub, sup, rev = "publisher", "support", "reviewer"
    plan: list[tuple[str, dict[str, Any], dict[str, int]]] = [
        (f"/api/v1/deliveries/dlv_{ns}_1/replay", {}, {pub: 403}),
        (f"/api/v1/deliveries/dlv_{ns}_1/replay",
         {"override": {"url": "https://elsewhere.example/"}}, {pub: 403}),
        (f"/api/v1/deliveries/dlv_{ns}_5/suppress", {"reason": "x"}, {pub: 403}),
        ("/api/v1/replays", {"delivery_ids": [f"dlv_{ns}_1"]}, {pub: 403}),
        ("/api/v1/replays", {"filter": {"app": w["a"]}, "confirm": 3}, {pub: 403}),
        (f"{ep}/rerender", {"confirm": 1}, {pub: 403}),
        (f"{ep}/test-send", {}, {pub: 403}),
        (ep, {"config": {"headers": {"X-Evil": "1"}}}, {pub: 403, sup: 403, rev: 403}),
        (ep, {"url": "https://evil.example/"}, {pub: 403, sup: 403, rev: 403}),
        (ep, {"event_types": ["conversion"]}, {pub: 403, sup: 403, rev: 403}),
        (f"{ep}/secrets", {"secret": generate_secret()}, {pub: 403, sup: 403, rev: 403}),
        # rights before input: a bad body from a role without the right is a 403 (audited),
        # not a 400 that says nothing was tried
        (f"{ep}/secrets", {}, {pub: 403, sup: 403, rev: 403}),
        (f"{ep}/secrets", {"secret": "x", "overlap_s": "-1"}, {sup: 403}),
        (ep, {"config": "{not json"}, {pub: 403, sup: 403, rev: 403}),
        ("/api/v1/endpoints", {"app_id": w["a"], "url": "https://evil.example/"},
         {pub: 403, sup: 403, rev: 403}),
        ("/api/v1/held/release", held, {pub: 404, sup: 403}),
        ("/api/v1/held/reject", held, {pub: 404, sup: 403}),
        ("/api/v1/held/release", {"all": True}, {pub: 404, sup: 403}),
        (f"/api/v1/dead-letters/dl_{ns}/resolve", {}, {pub: 403}),
        (f"/api/v1/suppressions/dlv_{ns}_8/resolve", {}, {pub: 403}),
        ("/api/v1/import", {"data": "legacy_id,endpoint_id\nx,y\n", "dry_run": False},
         {pub: 404, sup: 403}),
        # the same for replays, suppressions and their resolutions: a malformed body from
        # a publisher was a 400, unaudited
        (f"/api/v1/deliveries/dlv_{ns}_1/replay", {"override": {"fields": "payout"}},
         {pub: 403}),
        ("/api/v1/replays", {"delivery_ids": "not a list", "filter": 7}, {pub: 403}),
        (f"/api/v1/deliveries/dlv_{ns}_5/suppress", {"reason": ["a", "b"]}, {pub: 403}),
        (f"/api/v1/dead-letters/dl_{ns}/resolve", {"note": {"x": 1}}, {pub: 403}),
        (f"/api/v1/suppressions/dlv_{ns}_8/resolve", {"note": {"x": 1}}, {pub: 403}),
    ]
    reads: list[tuple[str, dict[str, int]]] = [
        ("/api/v1/held", {pub: 404}), ("/api/v1/dead-letters", {pub: 403}),
        ("/api/v1/suppressions", {pub: 403}), ("/api/v1/audit", {pub: 403}),
        (ep, {pub: 404}), (f"{ep}/rerender", {pub: 403}),
        (f"/api/v1/replays/preview?app={w['a']}", {pub: 403}),
        (f"/api/v1/replays/rpl_{ns}", {pub: 403}),
        (f"/api/v1/deliveries/dlv_{ns}_7", {pub: 404}),  # another app's
        (f"/api/v1/deliveries/dlv_{ns}_3", {pub: 404}),  # held
    ]
    with console_server(settings, lookup=_public_lookup) as port:
        clients = {pub: Client(port, bearer=token(settings, f"pub-{ns}", pub, (w["a"],))),
                   sup: Client(port, bearer=token(settings, f"sup-{ns}", sup)),
                   rev: Client(port, bearer=token(settings, f"rev-{ns}", rev))}
        for path, body, want in plan:
            for role, status in want.items():
                r = clients[role].post(path, body=body)
                assert r.status == status, (role, path, body, r.status, r.text)
        for path, want in reads:
            for role, status in want.items():
                r = clients[role].get(path)
                assert r.status == status, (role, path, r.status, r.text)
        # the page forms are the same handlers: a support with a valid CSRF token too
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", sup))
        r = page.post(f"/endpoints/{w['ep_a']}", form={"url": "https://evil.example/",
                                                       "csrf": page.csrf})
        assert r.status == 403, r.text
    assert _state(settings, ns, w) == before
    actors = [f"publisher:pub-{ns}", f"support:sup-{ns}", f"reviewer:rev-{ns}",
              f"support:sup2-{ns}"]
    done = [(a, x) for a, x in _actions_by(settings, actors)
            if not x.startswith("refused.") and x != "console.login"]
    assert done == [], done
    refused = {x for a, x in _actions_by(settings, [f"publisher:pub-{ns}"])}
    assert {"refused.replay", "refused.bulk_replay", "refused.suppress",
            "refused.resolve_dead_letter", "refused.resolve_suppression"} <= refused, refused


# --- CSRF ---------------------------------------------------------------------------------

def test_every_cookie_post_needs_its_own_csrf_token(settings: Settings, namespace: str) -> None:
    """Every POST route (from the router), signed in by cookie as an admin, sent as a
    cross-site page could send it (form, text/plain, JSON) without the CSRF token, with a
    wrong one, with another session's or with one from a cross-site Origin: 403, nothing
    changed, nothing audited but the refusals."""
    ns = namespace
    w = _world(settings, ns)
    _dead_letter(settings, ns, w)
    before = _state(settings, ns, w)
    paths = [_fill(t, w, ns) for t in _post_routes(settings) if t != "/login"]
    assert "/logout" in paths and len(paths) > 15, paths
    with console_server(settings, lookup=_public_lookup) as port:
        admin = Client(port)
        admin.sign_in(token(settings, f"adm-{ns}", "admin"))
        other = Client(port)
        other.sign_in(token(settings, f"adm2-{ns}", "admin"))
        assert admin.csrf and other.csrf and admin.csrf != other.csrf
        evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        fields = {"reason": "x", "note": "x", "url": "https://evil.example/",
                  "delivery_ids": f"dlv_{ns}_1", "all": "1", "confirm": "1",
                  "secret": generate_secret(), "app_id": w["a"], "data": "a,b\n1,2\n"}
        for path in paths:
            variants: list[tuple[str, dict[str, Any]]] = [
                ("form, no token", {"form": fields, "headers": evil}),
                ("form, wrong token", {"form": {**fields, "csrf": "0" * 40}}),
                ("form, another session's token", {"form": {**fields, "csrf": other.csrf}}),
                ("text/plain", {"raw": b'{"reason": "x", "delivery_ids": ["a"]}',
                                "headers": {"Content-Type": "text/plain", **evil}}),
                ("text/plain, csrf in it", {"raw": f"csrf={other.csrf}&reason=x".encode(),
                                            "headers": {"Content-Type": "text/plain"}}),
                ("json, no header", {"body": {"reason": "x", "csrf": admin.csrf}}),
                ("json, another session's header",
                 {"body": {"reason": "x"}, "headers": {"X-CSRF-Token": other.csrf}}),
                ("multipart", {"raw": b"--b\r\nContent-Disposition: form-data; name=\"reason\""
                               b"\r\n\r\nx\r\n--b--\r\n",
                               "headers": {"Content-Type": "multipart/form-data; boundary=b"}}),
            ]
            for what, kw in variants:
                r = admin.post(path, **kw)
                if what == "multipart":  # not a form the console reads: refused either way
                    assert r.status in (400, 403), (path, what, r.status, r.text)
                    continue
                assert r.status == 403 and "CSRF" in r.text, (path, what, r.status, r.text)
        assert admin.get("/api/v1/deliveries").status == 200  # not signed out by /logout
    assert _state(settings, ns, w) == before
    done = [(a, x) for a, x in _actions_by(settings, [f"admin:adm-{ns}"])
            if not x.startswith("refused.") and x != "console.login"]
    assert done == [], done


def test_signing_out_ends_the_session_on_the_server(settings: Settings, namespace: str) -> None:
    """A copy of the session cookie taken before the sign-out (a shared browser, a proxy's
    log) signs nothing in after it; the token's other sessions go on."""
    ns = namespace
    tok = token(settings, f"sup-{ns}", "support")
    with console_server(settings) as port:
        page, other = Client(port), Client(port)
        page.sign_in(tok)
        other.sign_in(tok)
        copy = Client(port, cookie=page.cookie)
        assert copy.get("/api/v1/deliveries").status == 200
        r = page.post("/logout", form={"csrf": page.csrf})
        assert r.status == 303 and "Max-Age=0" in r.headers["set-cookie"], r.headers
        assert copy.get("/api/v1/deliveries").status == 401
        assert copy.post("/logout", form={"csrf": copy.csrf or ""}).status == 401
        assert other.get("/api/v1/deliveries").status == 200
        assert Client(port, bearer=tok).get("/api/v1/deliveries").status == 200
    # signing in and out are audited (the copy's refused sign-out is not a sign-out)
    with connect(settings.database_url) as conn:
        rows = conn.execute("SELECT action FROM audit_log WHERE actor = %s AND action LIKE"
                            " 'console.log%%' ORDER BY audit_id", (f"support:sup-{ns}",)
                            ).fetchall()
    assert [r[0] for r in rows] == ["console.login", "console.login", "console.logout"]



def test_a_database_outage_tells_a_caller_nothing_about_the_database(
        settings: Settings) -> None:
    """PostgreSQL unreachable (an outage, a failover): any caller, signed in or not, gets a
    503 that names no user, host, port or database; the details go to the log."""
    from postbacks.tools.procs import free_port

    gone = settings.database_url.rsplit("@", 1)[0] + f"@127.0.0.1:{free_port()}/pb_secret_db"
    with console_server(dataclasses.replace(settings, database_url=gone)) as port:
        for client in (Client(port, bearer="pbk_anything"), Client(port, cookie="x.y.z.w")):
            r = client.get("/api/v1/deliveries")
            assert r.status == 503, r.text
            assert "unavailable" in r.json()["error"], r.text
            for leak in ("pb_secret_db", "127.0.0.1", gone.split("://")[1].split("@")[0],
                         "POSTBACKS_DATABASE_URL"):
                assert leak not in r.text, (leak, r.text)

# --- XSS ----------------------------------------------------------------------------------

_MARKUP = '"><script>alert(1)</script><img src=x onerror=alert(2)>'


def test_stored_and_reflected_values_are_escaped(settings: Settings, namespace: str) -> None:
    """Values the console does not control -- a receiver's response, request headers, error
    messages, endpoint names and configs, hold and suppression reasons, audit notes, the
    search box and the sign-in's next -- never become markup, in text or in attributes; no
    page has a script, and the CSP forbids one."""
    ns = namespace
    app, ep = f"app_{ns}", f"ep_{ns}"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=f"https://pub.example/{ep}",
                        name=_MARKUP, config=EndpointConfig.from_json(
                            {"headers": {"X-Note": _MARKUP}}))
        conn.commit()
    dead = held_delivery(ns, 1, endpoint=ep, app=app)
    insert_deliveries(settings, [dead], status="dead_lettered")
    held = held_delivery(ns, 2, endpoint=ep, app=app)
    insert_deliveries(settings, [held], status="held", reason=_MARKUP)
    did = dead["delivery_id"]
    now = dt.datetime.now(dt.UTC)
    with connect(settings.database_url) as conn:
        conn.execute(
            "INSERT INTO delivery_attempts (attempt_id, attempted_at, delivery_id, endpoint_id,"
            " idempotency_key, attempt_no, trigger, result, status_code, error_class,"
            " error_message, queue_ms, platform_ms, wire_ms, request_method, request_url,"
            " request_headers, request_body, response_excerpt) VALUES (%s, %s, %s, %s, %s, 1,"
            " 'first', 'failed', 500, 'http_5xx', %s, 0, 0, 0, 'POST', %s, %s, %s, %s)",
            (f"att_{uuid.uuid4().hex}", now, did, ep, dead["idempotency_key"], _MARKUP,
             f"https://pub.example/{ep}?x={_MARKUP}", Jsonb({"x-evil": _MARKUP}),
             _MARKUP.encode(), ("</pre>" + _MARKUP).encode()))
        conn.execute(
            "INSERT INTO delivery_outcomes (outcome_id, delivery_id, endpoint_id, app_id, kind,"
            " attempt_no, reason, actor, occurred_at) VALUES (%s, %s, %s, %s, 'dead_lettered',"
            " 1, %s, %s, %s)", (f"out_{uuid.uuid4().hex}", did, ep, app, _MARKUP, _MARKUP, now))
        conn.execute("INSERT INTO dead_letters (dead_letter_id, reason, error_class,"
                     " error_message, stage, origin_topic, origin_partition, origin_offset,"
                     " delivery_id, endpoint_id, occurred_at) VALUES (%s, %s, 'x', %s,"
                     " 'agent', 'dispatch.v1', 0, 1, %s, %s, now())",
                     (f"dl_{ns}", _MARKUP, _MARKUP, did, ep))
        conn.execute("INSERT INTO postback_suppressions (delivery_id, endpoint_id, reason)"
                     " VALUES (%s, %s, %s)", (did, ep, _MARKUP))
        conn.execute("INSERT INTO audit_log (actor, action, target_type, target_id, before,"
                     " after, note) VALUES (%s, 'delivery.replay', 'delivery', %s, %s, %s, %s)",
                     (_MARKUP, did, Jsonb({_MARKUP: _MARKUP}), Jsonb({"x": _MARKUP}), _MARKUP))
        conn.commit()
    with console_server(settings) as port:
        page = Client(port)
        page.sign_in(token(settings, f"adm-{ns}", "admin"))
        pages = [f"/deliveries/{did}", f"/endpoints/{ep}", f"/endpoints?app_id={app}",
                 f"/held?app={app}", f"/dead-letters?endpoint={ep}", "/suppressions",
                 f"/audit?target={did}", f"/deliveries?app={app}",
                 "/deliveries?q=%22%3E%3Cscript%3Ealert(1)%3C/script%3E",
                 "/audit?actor=%22%3E%3Cscript%3Ealert(1)%3C/script%3E",
                 "/nope%22%3E%3Cscript%3E"]
        seen_escaped = 0
        for path in pages:
            r = page.get(path)
            assert r.status in (200, 400, 404), (path, r.status)
            low = r.text.lower()
            assert "<script" not in low and "<img" not in low, (path, r.text)
            seen_escaped += r.text.count("&lt;script&gt;alert(1)&lt;/script&gt;")
            csp = r.headers["content-security-policy"]
            assert "script-src" not in csp and "default-src 'none'" in csp, path
        assert seen_escaped >= 8, seen_escaped  # the values are shown, as text
        r = Client(port).get("/login?next=%22%3E%3Cscript%3Ealert(1)%3C/script%3E")
        assert r.status == 200 and "<script" not in r.text.lower()
        assert '&#34;&gt;&lt;script&gt;' in r.text
        # the API answers JSON that no browser sniffs into a page
        api = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        r = api.get(f"/api/v1/deliveries/{did}")
        assert r.headers["content-type"].startswith("application/json")
        assert r.headers["x-content-type-options"] == "nosniff"


# --- injection and paging -----------------------------------------------------------------

def test_filters_and_paging_refuse_injection_and_out_of_range(
        settings: Settings, namespace: str) -> None:
    """SQL in any filter, sort or page parameter is a 400 that names it (or an exact
    match that finds nothing); limits and offsets outside their bounds are 400s."""
    ns = namespace
    w = _world(settings, ns)
    sqli = ["' OR '1'='1", "x'; DROP TABLE deliveries; --", "1 OR 1=1", "x\") OR (\"1\"=\"1",
            "dlv_x' UNION SELECT token_hash FROM console_tokens --", "%' OR 1=1 --"]
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        for v in sqli:
            enc = quote(v, safe="")
            for path, name in [("/api/v1/deliveries", n) for n in (
                    "q", "app", "endpoint", "status", "error", "error_class", "since", "until",
                    "created_from", "created_to", "cursor", "limit", "sort", "order")] + [
                    ("/api/v1/dead-letters", n) for n in (
                        "stage", "reason", "endpoint", "created_from", "limit", "offset",
                        "sort")] + [
                    ("/api/v1/audit", n) for n in ("action", "target_type", "target",
                                                   "limit", "order")] + [
                    ("/api/v1/endpoints", n) for n in ("state", "app_id", "limit", "offset",
                                                       "sort")] + [
                    ("/api/v1/replays/preview", n) for n in ("app", "q", "status")] + [
                    ("/api/v1/held", n) for n in ("app", "endpoint", "reason")]:
                r = sup.get(f"{path}?{name}={enc}")
                assert r.status == 400 and r.json()["error"], (path, name, v, r.status, r.text)
            # the audit actor is free text: matched exactly, never as SQL
            r = sup.get(f"/api/v1/audit?actor={enc}")
            assert r.status == 200 and r.json()["audit"] == [], (v, r.text)
        for path, bad in [
                ("/api/v1/deliveries", ["limit=0", "limit=-1", "limit=201", "limit=1e3",
                                        "limit=" + "9" * 40, "limit=%EF%BC%91",
                                        "cursor=-1:x", "cursor=" + "9" * 17 + ":x",
                                        "limit=1&limit=2x"]),
                ("/api/v1/dead-letters", ["limit=0", "limit=201", "offset=-1",
                                          "offset=100001", "offset=1e9", "offset=" + "9" * 40]),
                ("/api/v1/audit", ["limit=0", "limit=-5", "limit=201", "limit=" + "9" * 40]),
                ("/api/v1/endpoints", ["limit=0", "limit=501", "offset=-1",
                                       "offset=1000001", "limit=1&limit=2"])]:
            for q in bad:
                r = sup.get(f"{path}?{q}")
                assert r.status == 400, (path, q, r.status, r.text)
        # the largest legal page is served
        assert sup.get("/api/v1/deliveries?limit=200").status == 200
        assert sup.get("/api/v1/dead-letters?limit=200&offset=100000").status == 200
        # bodies: bulk filters and held selections carry the same checks
        for flt in ({"app": sqli[0]}, {"status": sqli[1]}, {"q": sqli[2]},
                    {"since": sqli[3]}, {"app": w["a"], "sort": "1"}):
            r = sup.post("/api/v1/replays", body={"filter": flt, "confirm": 1})
            assert r.status == 400, (flt, r.text)
    with connect(settings.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM deliveries WHERE delivery_id LIKE %s",
                            (f"dlv_{ns}_%",)).fetchone() == (8,)
        assert conn.execute("SELECT count(*) FROM replay_items WHERE delivery_id LIKE %s",
                            (f"dlv_{ns}_%",)).fetchone() == (0,)


# --- replays ------------------------------------------------------------------------------

def test_the_same_delivery_is_never_queued_twice(settings: Settings, namespace: str) -> None:
    """A replay of a delivery that already has a replay waiting to be published is refused
    (409): one after the other, two at once (exactly one wins), inside a bulk replay (left
    out, counted as queued) and through the page; the drainer then publishes it once. Once
    published, it is refused until the sink has recorded the replay (for at most an hour)."""
    ns = namespace
    w = _world(settings, ns)
    s = dataclasses.replace(settings, console_replay_per_app_hour=0)
    with console_server(s) as port:
        sup = Client(port, bearer=token(s, f"sup-{ns}", "support"))
        other = Client(port, bearer=token(s, f"sup2-{ns}", "support"))
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", body={"note": "first"})
        assert r.status == 202, r.text
        r = other.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", body={"note": "again"})
        assert r.status == 409 and "queued" in r.json()["error"], r.text
        r = other.post("/api/v1/replays", body={"delivery_ids": [f"dlv_{ns}_5"]})
        assert r.status == 409 and "queued" in r.json()["error"], r.text
        r = other.post(f"/api/v1/deliveries/dlv_{ns}_5/replay",
                       body={"override": {"fields": ["conversion_id"]}})
        assert r.status == 409 and "queued" in r.json()["error"], r.text
        page = Client(port)
        page.sign_in(token(s, f"sup3-{ns}", "support"))
        r = page.post(f"/deliveries/dlv_{ns}_5/replay", form={"csrf": page.csrf})
        assert r.status == 409 and "queued" in r.text, r.text
        # a bulk replay leaves the queued one out and says so
        r = other.post("/api/v1/replays", body={"filter": {"app": w["a"]}, "confirm": 2})
        assert r.status == 202, r.text
        assert r.json()["total"] == 2 and r.json()["skipped"].get("queued") == 1, r.text
        # two at once: exactly one is queued
        barrier = threading.Barrier(4)
        answers: list[int] = []

        def replay(c: Client) -> None:
            barrier.wait(10)
            answers.append(c.post(f"/api/v1/deliveries/dlv_{ns}_8/replay", body={}).status)

        threads = [threading.Thread(target=replay, args=(c,)) for c in (sup, other) * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(answers) == [202, 409, 409, 409], answers
    # delivered: 1, 2 (the bulk), 5 and 8 once each
    assert _drain(s) == 4
    sent = [decode("Delivery", m)["delivery_id"] for m in read_topic(s, RETRY_5S, 4)]
    assert sorted(sent) == sorted(f"dlv_{ns}_{n}" for n in (1, 2, 5, 8)), sent
    with connect(s.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM audit_log WHERE target_id = %s AND action"
                            " LIKE 'delivery.%%'", (f"dlv_{ns}_5",)).fetchone() == (1,)
    # Published, and its `replayed` outcome not yet recorded by the sink (none runs here):
    # the delivery's status is still `delivered`, and the replay is still in flight.
    with console_server(s) as port:
        sup = Client(port, bearer=token(s, f"sup4-{ns}", "support"))
        for n in (5, 8):
            r = sup.post(f"/api/v1/deliveries/dlv_{ns}_{n}/replay", body={})
            assert r.status == 409 and "not yet recorded" in r.json()["error"], r.text
        with connect(s.database_url) as conn:  # the sink records 5's outcome
            assert conn.execute(
                "INSERT INTO delivery_outcomes (outcome_id, delivery_id, endpoint_id, app_id,"
                " kind, attempt_no, occurred_at) SELECT i.outcome_id, i.delivery_id,"
                " i.endpoint_id, i.app_id, 'replayed', 0, now() FROM replay_items i"
                " WHERE i.delivery_id = %s", (f"dlv_{ns}_5",)).rowcount == 1
            # 8's was published over an hour ago and never recorded (the sink was down)
            conn.execute("UPDATE replay_items SET published_at = now() - interval '61 min'"
                         " WHERE delivery_id = %s", (f"dlv_{ns}_8",))
            conn.commit()
        for n in (5, 8):
            r = sup.post(f"/api/v1/deliveries/dlv_{ns}_{n}/replay", body={})
            assert r.status == 202, r.text


def test_replays_are_bounded(settings: Settings, namespace: str) -> None:
    """No request replays an unbounded set: a filter matching more than the bulk cap, more
    ids than the cap, more than 10,000 ids, a count past the per-app hour limit -- each is
    refused whole, and nothing is queued."""
    ns = namespace
    ep, app = f"ep_{ns}_m", f"app_{ns}_m"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url="https://pub.example/m")
        conn.commit()
    insert_deliveries(settings, [held_delivery(ns, i, endpoint=ep, app=app)
                                 for i in range(6)], status="dead_lettered")
    ids = [f"dlv_{ns}_{i}" for i in range(6)]
    s = dataclasses.replace(settings, console_bulk_max=4, console_bulk_confirm_above=2,
                            console_replay_per_app_hour=3)
    with console_server(s) as port:
        sup = Client(port, bearer=token(s, f"sup-{ns}", "support"))
        r = sup.post("/api/v1/replays", body={"filter": {"app": app}, "confirm": 6})
        assert r.status == 400 and "more than 4" in r.json()["error"], r.text
        assert sup.get(f"/api/v1/replays/preview?app={app}").json()["too_many"] is True
        r = sup.post("/api/v1/replays", body={"delivery_ids": ids})
        assert r.status == 400 and "at most 4" in r.json()["error"], r.text
        r = sup.post("/api/v1/replays", body={"delivery_ids": [f"d{i}" for i in range(10_001)]})
        assert r.status in (400, 413), r.text
        r = sup.post("/api/v1/replays", body={"delivery_ids": ids[:4]})
        assert r.status == 429 and r.json()["left"] == 3, r.text
        r = sup.post(f"/api/v1/endpoints/{ep}/rerender", body={"confirm": 6})
        assert r.status == 400 and "more than 4" in r.json()["error"], r.text
    with connect(s.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM replay_items WHERE app_id = %s",
                            (app,)).fetchone() == (0,)


# --- size, traversal, redirects ----------------------------------------------------------

def _raw(port: int, head: bytes, body: bytes = b"") -> bytes:
    """One raw HTTP/1.1 exchange (what http.client will not send); the answer's bytes."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as so:
        try:
            so.sendall(head + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" + body)
            while chunk := so.recv(65536):
                out += chunk
        except ConnectionResetError:  # the server answered and closed on an unread body
            pass
    return out


def test_oversized_and_malformed_requests_get_a_4xx(settings: Settings, namespace: str) -> None:
    ns = namespace
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        path = f"/api/v1/deliveries/dlv_{ns}_x/suppress"
        r = sup.post(path, raw=b'{"reason": "' + b"x" * 70_000 + b'"}',
                     headers={"Content-Type": "application/json"})
        assert r.status == 413
        r = sup.post(path, raw=b"reason=" + b"x" * 70_000,
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status == 413
        r = sup.post(path, raw=b'{"a":' * 100 + b"1" + b"}" * 100,
                     headers={"Content-Type": "application/json"})
        assert r.status == 400 and "nested" in r.json()["error"]
        r = sup.post(path, raw=b"&".join(b"a%d=1" % i for i in range(2000)),
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status == 400 and "fields" in r.json()["error"]
        r = sup.get("/api/v1/deliveries?" + "&".join(f"a{i}=1" for i in range(60)))
        assert r.status == 400
        # a note is copied into every audit row (and held outcome) of a bulk action
        r = sup.post("/api/v1/replays", body={"filter": {"status": "delivered"},
                                              "confirm": 1, "note": "n" * 1001})
        assert r.status == 400 and "note is 1,001 characters" in r.json()["error"], r.text
        for head, body in [
                (b"GET /api/v1/deliveries?a=" + b"x" * 20_000 + b" HTTP/1.1", b""),
                (b"GET /api/v1/deliveries HTTP/1.1\r\nX-Big: " + b"y" * 20_000, b""),
                (b"POST /login HTTP/1.1\r\nContent-Length: 100000000\r\n"
                 b"Content-Type: application/x-www-form-urlencoded", b"token=x"),
                (b"POST /login HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                 b"Content-Type: application/x-www-form-urlencoded",
                 (b"10000\r\n" + b"a" * 0x10000 + b"\r\n") * 2 + b"0\r\n\r\n"),
                (b"POST /login HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked",
                 b"0\r\n\r\n")]:
            status = int(_raw(port, head, body).split(b" ", 2)[1])
            assert 400 <= status < 500, (head[:60], status)
        assert sup.get("/api/v1/deliveries").status == 200  # still serving


def test_config_text_that_jsonb_cannot_hold_gets_a_400(settings: Settings, namespace: str) -> None:
    """An endpoint's config given as JSON text (a form field, or a string in the API body)
    is parsed after the body's own checks: NaN, a NUL escape or deep nesting in it passed
    the config's validation and failed in PostgreSQL's jsonb, a 500."""
    ns = namespace
    w = _world(settings, ns)
    ep = f"/api/v1/endpoints/{w['ep_a']}"
    texts = ['{"validator": {"kind": "json_field", "field": "status", "op": "equals",'
             ' "value": NaN}}',
             '{"aliases": {"payout_usd": "amt\\u0000"}}',
             '{"notify_endpoint_id": "ep_x\\u0000"}',
             '{"a": ' * 3000 + "1" + "}" * 3000]
    with console_server(settings) as port:
        adm = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        before = adm.get(ep).json()
        for text in texts:
            for path, body in [(ep, {"config": text}),
                               ("/api/v1/endpoints", {"app_id": w["a"], "config": text,
                                                      "url": "https://new.example/h"})]:
                r = adm.post(path, body=body)
                assert r.status == 400, (path, text[:60], r.status, r.text[:300])
                assert "config" in r.json()["error"], r.json()
        assert adm.get(ep).json() == before


def test_static_files_never_leave_their_folder(settings: Settings) -> None:
    with console_server(settings) as port:
        anon = Client(port)
        assert anon.get("/static/console.css").status == 200
        for path in ["/static/../web.py", "/static/%2e%2e/web.py", "/static/..%2fweb.py",
                     "/static/%2e%2e%2fweb.py", "/static/..%5cweb.py", "/static/..",
                     "/static/../../../../etc/passwd", "/static//etc/passwd",
                     "/static/%2fetc%2fpasswd", "/static/%2e%2e/%2e%2e/pyproject.toml",
                     "/static/console.css%00.py", "/static/./console.css",
                     "/static/console.css/..%2f..%2fweb.py", "/static/%252e%252e/web.py"]:
            r = anon.get(path)
            assert r.status in (400, 403, 404), (path, r.status)
            assert "aiohttp" not in r.text and "root:x" not in r.text, path
            assert "[project]" not in r.text, path


def test_no_open_redirect(settings: Settings, namespace: str) -> None:
    ns = namespace
    tok = token(settings, f"sup-{ns}", "support")
    with console_server(settings) as port:
        for nxt in ("//evil.example", "///evil.example", "/\\evil.example", "\\\\evil.example",
                    "https:evil.example", "http://evil.example", "HTTPS://EVIL.EXAMPLE",
                    "/%0d%0aLocation:%20https://evil.example", "/\u2215evil.example",
                    "/\uff0fevil.example", " /deliveries", "data:text/html,x",
                    "javascript:alert(1)", "/deliveries\r\nSet-Cookie: a=b", ""):
            r = Client(port).post("/login", form={"token": tok, "next": nxt})
            assert r.status == 303, (nxt, r.status)
            loc = r.headers["location"]
            # wherever the browser resolves it, it stays on the console
            assert urlsplit(urljoin("http://console.test/login", loc)).netloc == \
                "console.test", (nxt, loc)
            assert loc.startswith("/") and not loc.startswith(("//", "/\\")), (nxt, loc)
            assert not {"\r", "\n", "\\"} & set(loc), (nxt, loc)
        # a local path with a query comes back as it was
        r = Client(port).post("/login", form={"token": tok, "next": "/held?app=a_1"})
        assert r.headers["location"] == "/held?app=a_1"
        # the sign-in redirect of a page keeps the page's own path
        r = Client(port).get("/deliveries?status=held")
        assert r.status == 303 and r.headers["location"].startswith("/login?next=%2F")
        # an error page's back link never leaves the console
        page = Client(port)
        page.sign_in(tok)
        for ref in ("https://evil.example/deliveries", f"http://evil.example:{port}/x",
                    "//evil.example/x", "javascript:alert(1)"):
            r = page.get("/nope", headers={"Referer": ref})
            assert 'href="/deliveries" id="back"' in r.text, (ref, r.text)


# --- audit --------------------------------------------------------------------------------

def test_every_action_is_audited_with_who_when_and_what(
        settings: Settings, namespace: str) -> None:
    ns = namespace
    w = _world(settings, ns)
    _dead_letter(settings, ns, w, suppressed=True)
    extra = held_delivery(ns, 30, endpoint=w["ep_a"], app=w["a"])
    insert_deliveries(settings, [extra], status="held")
    started = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    s = dataclasses.replace(settings, console_replay_per_app_hour=0)
    with console_server(s, lookup=_public_lookup) as port:
        sup = Client(port, bearer=token(s, f"sup-{ns}", "support"))
        rev = Client(port, bearer=token(s, f"rev-{ns}", "reviewer"))
        adm = Client(port, bearer=token(s, f"adm-{ns}", "admin"))
        ep = f"/api/v1/endpoints/{w['ep_a']}"
        calls: list[tuple[Client, str, dict[str, Any], int]] = [
            (sup, f"/api/v1/deliveries/dlv_{ns}_1/replay", {"note": "n1"}, 202),
            (sup, "/api/v1/replays", {"delivery_ids": [f"dlv_{ns}_2"], "note": "n2"}, 202),
            (sup, f"/api/v1/deliveries/dlv_{ns}_5/suppress", {"reason": "poison"}, 200),
            (sup, f"/api/v1/suppressions/dlv_{ns}_8/resolve", {"note": "n3"}, 200),
            (sup, f"/api/v1/dead-letters/dl_{ns}/resolve", {"note": "n4"}, 200),
            (rev, "/api/v1/held/release", {"delivery_ids": [f"dlv_{ns}_3"], "note": "n5"}, 200),
            (rev, "/api/v1/held/reject", {"delivery_ids": [f"dlv_{ns}_30"], "note": "n6"}, 200),
            (adm, ep, {"config": {"headers": {"X-A": "b"}}, "note": "n7"}, 200),
            (adm, f"{ep}/secrets", {"secret": generate_secret()}, 200),
            (adm, "/api/v1/endpoints", {"app_id": w["a"], "url": "https://new.example/h",
                                        "note": "n8"}, 201),
        ]
        for client, path, body, status in calls:
            r = client.post(path, body=body)
            assert r.status == status, (path, r.status, r.text)
        created = r.json()["endpoint_id"]
    want = {(f"support:sup-{ns}", "delivery.replay", f"dlv_{ns}_1"),
            (f"support:sup-{ns}", "delivery.replay", f"dlv_{ns}_2"),
            (f"support:sup-{ns}", "delivery.suppress", f"dlv_{ns}_5"),
            (f"support:sup-{ns}", "suppression.resolve", f"dlv_{ns}_8"),
            (f"support:sup-{ns}", "dead_letter.resolve", f"dl_{ns}"),
            (f"reviewer:rev-{ns}", "held.release", f"dlv_{ns}_3"),
            (f"reviewer:rev-{ns}", "held.reject", f"dlv_{ns}_30"),
            (f"admin:adm-{ns}", "endpoint.update", w["ep_a"]),
            (f"admin:adm-{ns}", "endpoint.rotate_secret", w["ep_a"]),
            (f"admin:adm-{ns}", "endpoint.create", created)}
    with connect(s.database_url) as conn:
        rows = conn.execute(
            "SELECT actor, action, target_id, at, before, after FROM audit_log"
            " WHERE actor = ANY(%s) AND action NOT LIKE 'refused.%%'",
            ([f"support:sup-{ns}", f"reviewer:rev-{ns}", f"admin:adm-{ns}"],)).fetchall()
    got = {(r[0], r[1], r[2]) for r in rows}
    assert want <= got, want - got
    for r in rows:
        assert started <= r[3] <= dt.datetime.now(dt.UTC), r  # when
        assert r[4] is not None or r[5] is not None, r  # what changed


# --- the CLI ------------------------------------------------------------------------------

_COMMANDS = [("console",), ("console", "serve"), ("console", "token"),
             ("console", "token", "create"), ("console", "token", "list"),
             ("console", "token", "revoke"), ("deliveries",), ("deliveries", "list"),
             ("deliveries", "show"), ("deliveries", "replay"), ("deliveries", "rerender"),
             ("deliveries", "import"), ("held",), ("held", "list"), ("held", "release"),
             ("held", "reject"), ("endpoints",), ("endpoints", "create"),
             ("endpoints", "disabled"), ("endpoints", "enable")]


def test_cli_help_and_bad_arguments(settings: Settings, namespace: str,
                                    monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--help`` on every command exits 0 with a usage; a bad argument is a one-line
    error and a non-zero exit, never a traceback."""
    ns = namespace
    for cmd in _COMMANDS:
        capsys.readouterr()
        assert run_cli(monkeypatch, settings, *cmd, "--help") == 0, cmd
        assert "usage: postbacks " + " ".join(cmd) in capsys.readouterr().out, cmd
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = str(busy.getsockname()[1])
    bad = [
        ("console", "serve", "--port", "99999999"),
        ("console", "serve", "--port", "-1"),
        ("console", "serve", "--port", "http"),
        ("console", "serve", "--host", "127.0.0.1", "--port", taken, "--no-drain"),
        ("console", "token", "create", "--name", f"{ns}-" + "x" * 200, "--role", "support"),
        ("console", "token", "create", "--name", f"alice-{ns}\nadmin:root", "--role",
         "support"),
        ("console", "token", "create", "--name", "x", "--role", "root"),
        ("console", "token", "create", "--name", "x", "--role", "support", "--expires-in", "0d"),
        ("console", "token", "revoke"),
        ("console", "token", "revoke", f"tok_{ns}", "--by", " "),
        ("console", "token", "revoke", f"tok_{ns}", "--by", "admin:alice\nforged"),
        ("console", "token", "create", "--name", f"x-{ns}", "--role", "support", "--by",
         "admin:alice\x1b[2K"),
        ("deliveries", "list", "--limit", "0"), ("deliveries", "list", "--limit", "x"),
        ("deliveries", "list", "--limit", "9" * 30), ("deliveries", "list", "--app", "a' OR 1=1"),
        ("deliveries", "list", "--since", "yesterday"), ("deliveries", "list", "--cursor", "x"),
        ("deliveries", "show"), ("deliveries", "show", f"dlv_{ns}_none"),
        ("deliveries", "replay", "--actor", "x"),
        ("deliveries", "replay", f"dlv_{ns}_none", "--actor", " "),
        ("deliveries", "replay", f"dlv_{ns}_none", "--aliases", "{bad"),
        ("deliveries", "replay", f"dlv_{ns}_none", "--aliases", "[1]"),
        ("deliveries", "replay", f"dlv_{ns}_none", "--confirm", "x"),
        ("deliveries", "replay", f"dlv_{ns}_none", "--note", "n" * 1001),
        ("deliveries", "replay", f"dlv_{ns}_none", "--role", "publisher"),
        ("deliveries", "rerender"), ("deliveries", "rerender", "--endpoint", f"ep_{ns}_none"),
        ("deliveries", "import", f"/nonexistent/{ns}.csv"), ("deliveries", "import", "/"),
        ("held", "list", "--limit", "-1"), ("held", "list", "--limit", "0"),
        ("held", "list", "--limit", "9" * 30), ("held", "list", "--limit", "x"),
        ("held", "release", "--actor", "x"),
        ("held", "release", "--all", "--actor", "x", "--limit", "-5"),
        ("held", "reject", "--delivery-id", f"dlv_{ns}_none", "--actor", "x"),
        ("held", "release", "--delivery-id", "a", "--all", "--actor", "x"),
        ("endpoints", "create", "--app", "a", "--url", "https://x.example/", "--config", "{"),
        ("endpoints", "create", "--app", "a", "--url", "https://x.example/", "--config", "[1]"),
        ("endpoints", "create", "--app", "a", "--url", "https://x.example/", "--config",
         '{"validator": {"kind": "json_field", "field": "s", "op": "equals", "value": NaN}}'),
        ("endpoints", "create", "--app", "a", "--url", "https://x.example/", "--config",
         '{"aliases": {"payout_usd": "amt\\u0000"}}'),
        ("endpoints", "create", "--app", "a", "--url", "https://x.example/", "--config",
         "[" * 5000 + "]" * 5000),
        ("deliveries", "replay", f"dlv_{ns}_none", "--aliases", '{"payout": "a\\u0000"}'),
        ("endpoints", "enable", f"ep_{ns}_none", "--backlog", "bogus", "--actor", "x"),
        ("deliveries", "bogus"), ("held",), ("console",),
    ]
    try:
        for argv in bad:
            capsys.readouterr()
            try:
                code = run_cli(monkeypatch, settings, *argv)
            except Exception as exc:  # a traceback is the failure this test looks for
                raise AssertionError(f"{argv}: {type(exc).__name__}: {exc}") from exc
            err = capsys.readouterr().err
            assert code != 0, argv
            assert "Traceback" not in err and "error" in err.lower(), (argv, err)
    finally:
        busy.close()
    with connect(settings.database_url) as conn:  # no token was made by a refused create
        assert conn.execute("SELECT count(*) FROM console_tokens WHERE name LIKE %s",
                            (f"%{ns}%",)).fetchone() == (0,)
