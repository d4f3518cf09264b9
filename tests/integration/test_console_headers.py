"""The console's security headers, TLS detection behind trusted proxies, human error pages,
the audit table, and a publisher's view of its own held-then-released deliveries — all
against the real console and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from dataclasses import replace

from psycopg.types.json import Jsonb

from postbacks.core.endpoint import EndpointConfig
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.errors import ConfigError
from postbacks.settings import Settings, load_settings
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from tests.integration.console_util import Client, console_server, token

_STRICT = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer"}


def _assert_strict(headers: dict[str, str], what: str) -> None:
    csp = headers.get("content-security-policy", "")
    for part in ("default-src 'none'", "style-src 'self'", "frame-ancestors 'none'",
                 "form-action 'self'", "base-uri 'none'"):
        assert part in csp, (what, csp)
    assert "script-src" not in csp and "unsafe-inline" not in csp, (what, csp)
    for k, v in _STRICT.items():
        assert headers.get(k) == v, (what, k, headers)


def test_every_response_carries_the_security_headers(settings: Settings,
                                                     namespace: str) -> None:
    ns = namespace
    with console_server(settings) as port:
        anon = Client(port)
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        replies = {
            "login": anon.get("/login"), "login post": anon.post("/login", form={"token": "x"}),
            "healthz": anon.get("/healthz"), "metrics": anon.get("/metrics"),
            "static": anon.get("/static/console.css"), "redirect": anon.get("/deliveries"),
            "api 401": anon.get("/api/v1/deliveries"), "api": sup.get("/api/v1/deliveries"),
            "api 404": sup.get("/api/v1/nope"), "api 400": sup.get("/api/v1/deliveries?x=1"),
            "page": page.get("/deliveries"), "page 404": page.get("/nope"),
            "page 405": page.request("PUT", "/deliveries",
                                     headers={"X-CSRF-Token": page.csrf or ""}),
            "page 400": page.get("/deliveries?status=bogus"),
        }
        for what, r in replies.items():
            _assert_strict(r.headers, what)
            assert "strict-transport-security" not in r.headers, what  # plain HTTP
        for what in ("api 401", "api", "api 404", "api 400", "page", "page 404"):
            assert replies[what].headers.get("cache-control") == "no-store", what
        css = replies["static"]
        assert css.status == 200 and css.headers["content-type"].startswith("text/css")
        assert "body {" in css.text
        html = replies["page"].text
        assert '<link rel="stylesheet" href="/static/console.css">' in html
        assert "<style" not in html and "<script" not in html and "javascript:" not in html
        assert replies["page 405"].status == 405 and "allow" in replies["page 405"].headers


def test_forwarded_https_counts_only_from_a_trusted_proxy(settings: Settings,
                                                          namespace: str) -> None:
    ns = namespace
    tok = token(settings, f"adm-{ns}", "admin")
    fwd = {"X-Forwarded-Proto": "https"}
    with console_server(settings) as port:  # no trusted proxies: the header is ignored
        r = Client(port).post("/login", form={"token": tok}, headers=fwd)
        assert r.status == 303 and "secure" not in r.headers["set-cookie"].lower()
        assert "strict-transport-security" not in Client(port).get("/login",
                                                                   headers=fwd).headers
        r = Client(port).post("/login", form={"token": tok},
                              headers={**fwd, "Origin": f"https://127.0.0.1:{port}"})
        assert r.status == 403  # the browser's origin is not this console's
        # no-referrer: the browser's own form posts "Origin: null" with same-origin
        r = Client(port).post("/login", form={"token": tok},
                              headers={"Origin": "null", "Sec-Fetch-Site": "same-origin"})
        assert r.status == 303
        for site in ("cross-site", "same-site", "none"):
            r = Client(port).post("/login", form={"token": tok},
                                  headers={"Origin": "null", "Sec-Fetch-Site": site})
            assert r.status == 403, site
    for trusted in ("127.0.0.1", "10.0.0.0/8, 127.0.0.0/8"):
        s = replace(settings, console_trusted_proxies=trusted)
        with console_server(s) as port:
            r = Client(port).post("/login", form={"token": tok},
                                  headers={**fwd, "Origin": f"https://127.0.0.1:{port}"})
            assert r.status == 303, r.text
            assert "secure" in r.headers["set-cookie"].lower()
            assert r.headers["strict-transport-security"].startswith("max-age=")
            plain = Client(port).get("/login")  # same proxy, plain HTTP: no HSTS
            assert "strict-transport-security" not in plain.headers
            r = Client(port).post("/login", form={"token": tok})
            assert "secure" not in r.headers["set-cookie"].lower()
    s = replace(settings, console_trusted_proxies="10.9.9.9")  # not the peer
    with console_server(s) as port:
        r = Client(port).post("/login", form={"token": tok}, headers=fwd)
        assert "secure" not in r.headers["set-cookie"].lower()
    import os

    env = {**os.environ, "POSTBACKS_CONSOLE_TRUSTED_PROXIES": "127.0.0.1,not-an-ip"}
    try:
        load_settings(env)
    except ConfigError as exc:
        assert "POSTBACKS_CONSOLE_TRUSTED_PROXIES" in str(exc)
    else:
        raise AssertionError("a bad trusted proxy was accepted")


def test_error_pages_are_pages_and_bad_bytes_are_4xx(settings: Settings,
                                                     namespace: str) -> None:
    ns = namespace
    with console_server(settings) as port:
        page = Client(port)
        page.sign_in(token(settings, f"sup-{ns}", "support"))
        r = page.get(f"/deliveries/dlv_{ns}_none")
        assert r.status == 404
        assert 'id="error-status">Not Found' in r.text and "no delivery" in r.text
        assert 'href="/deliveries" id="back"' in r.text
        r = page.get("/audit?colour=red")
        assert r.status == 400 and "Bad Request" in r.text and "unknown audit filter" in r.text
        assert 'href="/audit" id="back"' in r.text
        r = page.get("/held", headers={"Referer": f"http://127.0.0.1:{port}/dead-letters"})
        assert r.status == 200
        r = page.get("/nope", headers={"Referer": f"http://127.0.0.1:{port}/dead-letters"})
        assert r.status == 404 and 'href="/dead-letters" id="back"' in r.text
        r = page.get("/nope", headers={"Referer": "https://evil.example/x"})
        assert 'href="https://evil.example' not in r.text
        sup = Client(port, bearer=token(settings, f"sup2-{ns}", "support"))
        for path, status in [("/api/v1/replays/%00", 400), ("/api/v1/deliveries/a%00b", 400),
                             ("/api/v1/replays/a%20b", 404), ("/api/v1/deliveries/%C3%A9", 404),
                             ("/api/v1/deliveries?app=%00", 400),
                             ("/api/v1/deliveries?app=%ff%fe", 400),
                             ("/api/v1/deliveries?app=%ed%a0%80", 400),
                             ("/api/v1/audit?actor=" + "a" * 1200, 400),
                             ("/api/v1/audit?actor=x%00", 400)]:
            r = sup.get(path)
            assert r.status == status, (path, r.text)
            assert r.json()["error"], path
        for body, words in [(b'{"reason": "a\\u0000b"}', "NUL"),
                            (b'{"reason": "\\udc80"}', "UTF-8"),
                            (b'{"reason": "\xff"}', "not JSON"),
                            (b"[" * 50_000, "nested"),
                            (b'{"confirm": 1e400}', "finite"),
                            (b'{"overlap_s": ' + b"9" * 30 + b"}", "too large")]:
            r = sup.post(f"/api/v1/deliveries/dlv_{ns}_x/suppress", raw=body,
                         headers={"Content-Type": "application/json"})
            assert r.status == 400 and words in r.json()["error"], (body[:40], r.text)
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_x/suppress", raw=b"reason=%ff",
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status == 400 and "UTF-8" in r.json()["error"]
        for bad in ("pbc_\xff\xfe", "x" * 600):  # bytes that are not UTF-8; too long
            r = Client(port, bearer=bad).get("/api/v1/deliveries")
            assert r.status == 401 and "malformed" in r.json()["error"]
        r = page.post(f"/deliveries/dlv_{ns}_x/suppress", form={"reason": "x"},
                      headers={"X-CSRF-Token": "é"})
        assert r.status == 403 and "CSRF" in r.text
        r = Client(port, cookie="a.b\xffc").get("/api/v1/deliveries")
        assert r.status == 400 and "Cookie" in r.json()["error"]
        # a malformed session cookie (planted by a neighbouring site or subdomain) counts as
        # none: refused, it refused the sign-in page too, and every page looped to /login
        for planted in ("a.b'c", "x" * 401):
            c = Client(port, cookie=planted)
            r = c.get("/api/v1/deliveries")
            assert r.status == 401 and "sign in first" in r.json()["error"], r.text
            assert c.get("/login").status == 200
            c.sign_in(token(settings, f"sup-planted-{ns}-{len(planted)}", "support"))
            assert c.cookie != planted and c.get("/deliveries").status == 200


def test_the_audit_log_is_a_filterable_table(settings: Settings, namespace: str) -> None:
    ns = namespace
    with connect(settings.database_url) as conn:
        for actor, action, target in ((f"support:a-{ns}", "delivery.replay", f"dlv_{ns}_1"),
                                      (f"support:a-{ns}", "delivery.suppress", f"dlv_{ns}_2"),
                                      (f"admin:b-{ns}", "endpoint.update", f"ep_{ns}")):
            conn.execute("INSERT INTO audit_log (actor, action, target_type, target_id, before,"
                         " after) VALUES (%s, %s, %s, %s, %s, %s)",
                         (actor, action, "endpoint" if target.startswith("ep_") else "delivery",
                          target, Jsonb({"url": "https://old.example/"}),
                          Jsonb({"url": "https://new.example/"})))
        conn.commit()
    with console_server(settings) as port:
        page = Client(port)
        page.sign_in(token(settings, f"sup-{ns}", "support"))
        r = page.get(f"/audit?actor=support:a-{ns}")
        assert r.status == 200 and '<table id="audit"' in r.text
        assert f"dlv_{ns}_1" in r.text and f"dlv_{ns}_2" in r.text and f"ep_{ns}" not in r.text
        assert "url: https://old.example/ → https://new.example/" in r.text
        assert '{"url"' not in r.text  # a table of changes, not raw JSON
        r = page.get(f"/audit?actor=support:a-{ns}&action=delivery.suppress")
        assert f"dlv_{ns}_2" in r.text and f"dlv_{ns}_1" not in r.text
        r = page.get(f"/audit?target=ep_{ns}&target_type=endpoint")
        assert f"ep_{ns}" in r.text and f"dlv_{ns}_1" not in r.text
        api = Client(port, bearer=token(settings, f"sup2-{ns}", "support"))
        rows = api.get(f"/api/v1/audit?target_id=dlv_{ns}_1").json()["audit"]
        assert [x["action"] for x in rows] == ["delivery.replay"]
        for q in ("action=DROP%20TABLE", "target_type=a-b", "target=a%20b", "limit=0",
                  "limit=201", "target=a&target_id=b"):
            r = api.get(f"/api/v1/audit?{q}")
            assert r.status == 400, (q, r.text)


def test_a_publisher_sees_nothing_of_a_hold_or_release(settings: Settings,
                                                       namespace: str) -> None:
    """A publisher's delivery that was held, released by a reviewer and then delivered
    reads like any delivered one; one still held or just released is not listed."""
    ns = namespace
    app, ep = f"app_{ns}", f"ep_{ns}"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=f"https://pub.example/{ep}",
                        config=EndpointConfig())
        conn.commit()
    done, held, released, rejected = (held_delivery(ns, n, endpoint=ep, app=app)
                                      for n in (1, 2, 3, 4))
    insert_deliveries(settings, [done], status="delivered", reason="retrodated")
    insert_deliveries(settings, [held], status="held", reason="retrodated")
    insert_deliveries(settings, [released], status="released", reason="retrodated")
    insert_deliveries(settings, [rejected], status="rejected", reason="retrodated")
    did = done["delivery_id"]
    now = dt.datetime.now(dt.UTC)
    with connect(settings.database_url) as conn:  # what the sink writes for held → released
        conn.execute("UPDATE deliveries SET held_at = %s WHERE delivery_id = %s",
                     (now - dt.timedelta(minutes=5), did))
        for i, (kind, reason, actor) in enumerate((
                ("held", "retrodated", None), ("released", "checked", f"reviewer:r-{ns}"),
                ("delivered", None, None))):
            conn.execute(
                "INSERT INTO delivery_outcomes (outcome_id, delivery_id, endpoint_id, app_id,"
                " kind, attempt_no, reason, actor, occurred_at)"
                " VALUES (%s, %s, %s, %s, %s, 1, %s, %s, %s)",
                (f"out_{uuid.uuid4().hex}", did, ep, app, kind, reason, actor,
                 now - dt.timedelta(minutes=3 - i)))
        conn.execute(
            "INSERT INTO delivery_attempts (attempt_id, attempted_at, delivery_id, endpoint_id,"
            " idempotency_key, attempt_no, trigger, result, status_code, queue_ms, platform_ms,"
            " wire_ms, request_method, request_url, request_headers)"
            " VALUES (%s, %s, %s, %s, %s, 1, 'release', 'delivered', 200, 0, 0, 0, 'POST', %s,"
            " %s)", (f"att_{uuid.uuid4().hex}", now, did, ep, done["idempotency_key"],
                     f"https://pub.example/{ep}", Jsonb({})))
        conn.commit()
    leak = re.compile(r"\bheld|\brelease|\breject|\bhold\b|hold_reason", re.IGNORECASE)
    with console_server(settings) as port:
        staff = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        seen = staff.get(f"/api/v1/deliveries/{did}").json()
        assert {o["kind"] for o in seen["outcomes"]} == {"held", "released", "delivered"}
        assert seen["attempts"][0]["trigger"] == "release"  # staff see it all

        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", (app,)))
        listed = pub.get("/api/v1/deliveries?limit=200").json()["deliveries"]
        assert [d["delivery_id"] for d in listed] == [did]
        d = pub.get(f"/api/v1/deliveries/{did}").json()
        assert d["status"] == "delivered"
        assert [o["kind"] for o in d["outcomes"]] == ["delivered"]
        assert [a["trigger"] for a in d["attempts"]] == ["retry"]
        assert not {"hold_reason", "held_at_ms", "snapshot"} & set(d)
        text = pub.get(f"/api/v1/deliveries/{did}").text
        assert not leak.search(text), text
        for other in (held, released, rejected):
            assert pub.get(f"/api/v1/deliveries/{other['delivery_id']}").status == 404
        for status in ("held", "released", "rejected"):
            r = pub.get(f"/api/v1/deliveries?status={status}")
            assert r.status == 200 and r.json()["deliveries"] == []
        r = pub.get("/api/v1/deliveries?status=bogus")
        assert r.status == 400 and not leak.search(r.text), r.text
        for path in ("/api/v1/held", "/held"):
            assert pub.get(path).status == 404
        r = pub.post("/api/v1/held/release", body={"delivery_ids": [held["delivery_id"]]})
        assert r.status == 404 and not leak.search(r.text), r.text
        r = pub.get("/api/v1/replays/preview?status=bogus")
        assert r.status == 403 and not leak.search(r.text), r.text
        r = pub.post("/api/v1/replays", body={"filter": {"status": "bogus"}})
        assert r.status == 403 and not leak.search(r.text), r.text

        page = Client(port)
        page.sign_in(token(settings, f"pub2-{ns}", "publisher", (app,)))
        for path in ("/deliveries", f"/deliveries/{did}", "/deliveries?status=held"):
            html = page.get(path).text
            assert not leak.search(html), (path, leak.search(html))
        assert did in page.get("/deliveries").text
        r = page.get("/held")
        assert r.status == 404 and not leak.search(r.text)
