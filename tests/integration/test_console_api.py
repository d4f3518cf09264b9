"""The replay console's API and pages against real PostgreSQL and Kafka: role boundaries,
CSRF, the replay rate limit, bulk confirmation, the SSRF check on edits, bad input, the
drainer's per-endpoint cap, the audit trail of every mutation, and CLI parity."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from postbacks.core.endpoint import EndpointConfig
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from postbacks.tools.procs import wait_for
from replay_console.drain import Drainer
from tests.integration.anomaly_helpers import (
    held_delivery,
    insert_deliveries,
    run_cli,
    topic_size,
)
from tests.integration.console_util import (
    Client,
    console_server,
    endpoint_with_deliveries,
    insert_dead_letter,
    token,
)
from tests.kafka_util import decode, read_topic
from topics import TOPICS

RETRY_5S = TOPICS.retry_tier("5s").base


GEN = "does not resolve to an address postbacks may send to"


def _world(settings: Settings, ns: str) -> dict[str, Any]:
    """Two apps, an endpoint each; deliveries in every interesting status."""
    w: dict[str, Any] = {"a": f"app_{ns}_a", "b": f"app_{ns}_b",
                         "ep_a": f"ep_{ns}_a", "ep_b": f"ep_{ns}_b"}
    with connect(settings.database_url) as conn:
        for app, ep in ((w["a"], w["ep_a"]), (w["b"], w["ep_b"])):
            upsert_endpoint(conn, endpoint_id=ep, app_id=app,
                            url=f"https://pub.example/{ep}", config=EndpointConfig())
        conn.commit()
    plan = [(1, "a", "delivered"), (2, "a", "delivered"), (3, "a", "held"),
            (4, "a", "rejected"), (5, "a", "dead_lettered"), (6, "a", "pending"),
            (7, "b", "delivered"), (8, "b", "dead_lettered")]
    for n, app, status in plan:
        d = held_delivery(ns, n, endpoint=w[f"ep_{app}"], app=w[app])
        insert_deliveries(settings, [d], status=status)
        w[f"d{n}"] = d
    return w


def _ids(rows: list[dict[str, Any]]) -> set[str]:
    return {r["delivery_id"] for r in rows}


def _audit(settings: Settings, target_id: str) -> list[tuple[str, str]]:
    with connect(settings.database_url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT actor, action FROM audit_log WHERE target_id = %s ORDER BY audit_id",
            (target_id,))]


def test_roles_and_the_publisher_scope(settings: Settings, namespace: str) -> None:
    w = _world(settings, namespace)
    ns = namespace
    with console_server(settings) as port:
        anon = Client(port)
        assert anon.get("/api/v1/deliveries").status == 401
        page = anon.get("/deliveries")
        assert page.status == 303 and page.headers["location"].startswith("/login")
        assert Client(port, bearer="pbc_not_a_token").get("/api/v1/deliveries").status == 401

        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", (w["a"],)))
        seen = _ids(pub.get("/api/v1/deliveries?limit=200").json()["deliveries"])
        assert {f"dlv_{ns}_{n}" for n in (1, 2, 5)} <= seen
        # held, rejected, pending and the other app's never appear, filtered or not
        for n in (3, 4, 6, 7, 8):
            assert f"dlv_{ns}_{n}" not in seen
        for status in ("held", "rejected", "pending"):
            r = pub.get(f"/api/v1/deliveries?app={w['a']}&status={status}")
            assert r.status == 200 and r.json()["deliveries"] == []
        assert pub.get(f"/api/v1/deliveries?app={w['b']}").json()["deliveries"] == []
        for n in (3, 4, 7):
            assert pub.get(f"/api/v1/deliveries/dlv_{ns}_{n}").status == 404
        mine = pub.get(f"/api/v1/deliveries/dlv_{ns}_1").json()
        assert "snapshot" not in mine and "hold_reason" not in mine
        for path in ("/api/v1/held", "/api/v1/dead-letters", "/api/v1/audit",
                     f"/api/v1/endpoints/{w['ep_a']}"):
            assert pub.get(path).status in (403, 404), path
        r = pub.post(f"/api/v1/deliveries/dlv_{ns}_1/replay", body={})
        assert r.status == 403 and "publisher may not" in r.json()["error"]

        pub_page = Client(port)
        pub_page.sign_in(token(settings, f"pub2-{ns}", "publisher", (w["a"],)))
        html = pub_page.get("/deliveries?limit=200").text
        assert f"dlv_{ns}_1" in html and f"dlv_{ns}_3" not in html and "Held" not in html
        assert pub_page.get("/held").status == 404

        support = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        staff_seen = _ids(support.get(f"/api/v1/deliveries?app={w['a']}").json()["deliveries"])
        assert f"dlv_{ns}_3" in staff_seen  # staff see held ones
        r = support.post("/api/v1/held/release", body={"delivery_ids": [f"dlv_{ns}_3"]})
        assert r.status == 403 and "only a reviewer" in r.json()["error"]
        r = support.post(f"/api/v1/endpoints/{w['ep_a']}", body={"url": "https://x.example/"})
        assert r.status == 403
        assert topic_size(settings, RETRY_5S) == 0

        reviewer = Client(port, bearer=token(settings, f"rev-{ns}", "reviewer"))
        r = reviewer.post("/api/v1/held/release",
                          body={"delivery_ids": [f"dlv_{ns}_3"], "note": "checked"})
        assert r.status == 200, r.text
        assert r.json()["delivery_ids"] == [f"dlv_{ns}_3"]
    records = [decode("Delivery", m) for m in read_topic(settings, RETRY_5S, 1)]
    assert records[0]["idempotency_key"] == w["d3"]["idempotency_key"]
    assert records[0]["trigger"] == "release"
    assert records[0]["triggered_by"] == f"reviewer:rev-{ns}"
    assert ("reviewer:rev-" + ns, "held.release") in _audit(settings, f"dlv_{ns}_3")


def test_a_cohort_release_resolves_what_the_page_showed(
        settings: Settings, namespace: str) -> None:
    """The held page's cohort form posted only the cohort and the count shown, and the
    release selected again at the click: deliveries held after the page was read went out
    unreviewed with the rest, and the count was only checked above 100."""
    ns = namespace
    ep, app = f"ep_{ns}_c", f"app_{ns}_c"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=f"https://pub.example/{ep}",
                        config=EndpointConfig())
        conn.commit()
    insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep, app=app) for n in (1, 2)])
    cohort = {"endpoint": ep, "reason": "retrodated"}
    with console_server(settings) as port:
        page = Client(port)
        page.sign_in(token(settings, f"rev-page-{ns}", "reviewer"))
        shown = page.get("/held").text
        form = re.search(r'name="endpoint" value="' + ep + r'".*?</form>', shown, re.S)
        assert form is not None, shown
        assert 'name="confirm" value="2"' in form.group(0)
        held_until = int(re.findall(r'name="held_until" value="(\d+)"', form.group(0))[0])
        # held later than the newest hold shown (the helper holds at its clock - 1 s)
        wait_for(lambda: time.time() * 1000 >= held_until + 1002, 10, interval=0.005,
                 what="the clock past the newest hold shown")
        insert_deliveries(settings, [held_delivery(ns, 3, endpoint=ep, app=app)])  # later

        rev = Client(port, bearer=token(settings, f"rev-{ns}", "reviewer"))
        r = rev.post("/api/v1/held/release", body={**cohort, "confirm": 2})
        assert r.status == 409 and r.json()["needs_confirmation"] == 3, r.text
        assert "nothing was released" in r.json()["error"]
        assert topic_size(settings, RETRY_5S) == 0
        r = rev.post("/api/v1/held/release",
                     body={**cohort, "confirm": 2, "held_until": held_until})
        assert r.status == 200, r.text
        assert sorted(r.json()["delivery_ids"]) == [f"dlv_{ns}_1", f"dlv_{ns}_2"]
    assert ("reviewer:rev-" + ns, "held.release") not in _audit(settings, f"dlv_{ns}_3")
    with connect(settings.database_url) as conn:
        assert conn.execute("SELECT status FROM deliveries WHERE delivery_id = %s",
                            (f"dlv_{ns}_3",)).fetchone() == ("held",)


def test_csrf_is_required_on_every_cookie_form(settings: Settings, namespace: str) -> None:
    w = _world(settings, namespace)
    ns = namespace
    with console_server(settings) as port:
        c = Client(port)
        c.sign_in(token(settings, f"sup-{ns}", "support"))
        assert c.csrf
        path = f"/deliveries/dlv_{ns}_5/suppress"
        r = c.post(path, form={"reason": "poison"})
        assert r.status == 403 and "CSRF" in r.text
        r = c.post(path, form={"reason": "poison", "csrf": "0" * 40})
        assert r.status == 403
        r = c.post(path, body={"reason": "poison"})  # JSON with the cookie: still needs it
        assert r.status == 403
        with connect(settings.database_url) as conn:
            assert conn.execute("SELECT count(*) FROM postback_suppressions WHERE"
                                " delivery_id = %s", (f"dlv_{ns}_5",)).fetchone() == (0,)
        r = c.post(path, form={"reason": "poison", "csrf": c.csrf})
        assert r.status == 303, r.text
        r = c.post(f"/api/v1/deliveries/dlv_{ns}_8/suppress", body={"reason": "x"},
                   headers={"X-CSRF-Token": c.csrf})
        assert r.status == 200, r.text
        # A bearer token is not an ambient credential: no CSRF token needed.
        b = Client(port, bearer=token(settings, f"sup2-{ns}", "support"))
        r = b.post(f"/api/v1/deliveries/dlv_{ns}_1/replay", body={})
        assert r.status == 202, r.text
        # a second suppression of the same delivery is refused
        r = b.post(f"/api/v1/deliveries/dlv_{ns}_5/suppress", body={"reason": "again"})
        assert r.status == 409
    assert (f"support:sup-{ns}", "delivery.suppress") in _audit(settings, f"dlv_{ns}_5")
    del w


def _drain(settings: Settings, *, limit: int = 50) -> int:
    drainer = Drainer(settings)
    total = 0
    with connect(settings.database_url) as conn:
        for _ in range(limit):
            n = drainer.tick(conn)
            conn.commit()
            total += n
            if drainer.pending(conn) == 0:
                conn.commit()
                break
            drainer.last -= 1.0  # a second later: the buckets refill
    return total


def test_replay_redrives_with_the_original_key_and_is_audited(
        settings: Settings, namespace: str) -> None:
    w = _world(settings, namespace)
    ns = namespace
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", body={"note": "fixed upstream"})
        assert r.status == 202, r.text
        job = r.json()["job_id"]
        for n, words in ((3, "1 held"), (4, "1 rejected"), (6, "1 pending")):
            r = sup.post(f"/api/v1/deliveries/dlv_{ns}_{n}/replay", body={})
            assert r.status == 409 and words in r.json()["error"], r.text
        assert sup.post(f"/api/v1/deliveries/dlv_{ns}_nope/replay", body={}).status == 404
        assert sup.get(f"/api/v1/replays/{job}").json()["state"] == "queued"
        assert _drain(settings) == 1
        status = sup.get(f"/api/v1/replays/{job}").json()
        assert (status["state"], status["published"], status["not_published"]) == ("done", 1, 0)
    [m] = read_topic(settings, RETRY_5S, 1)
    d = decode("Delivery", m)
    assert m.key() == w["ep_a"].encode()
    assert d["delivery_id"] == f"dlv_{ns}_5"
    assert d["idempotency_key"] == w["d5"]["idempotency_key"]
    assert (d["trigger"], d["triggered_by"], d["override"]) == (
        "manual", f"support:sup-{ns}", None)
    outcomes = [decode("Outcome", x) for x in read_topic(settings, TOPICS.outcomes.base, 1)]
    assert [(o["kind"], o["actor"]) for o in outcomes] == [("replayed", f"support:sup-{ns}")]
    assert (f"support:sup-{ns}", "delivery.replay") in _audit(settings, f"dlv_{ns}_5")
    assert (f"support:sup-{ns}", "replay.replay") in _audit(settings, job)


def test_replay_rate_limit_per_app_per_hour(settings: Settings, namespace: str) -> None:
    from dataclasses import replace

    w = _world(settings, namespace)
    ns = namespace
    limited = replace(settings, console_replay_per_app_hour=2)
    with console_server(limited) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        assert sup.post(f"/api/v1/deliveries/dlv_{ns}_1/replay", body={}).status == 202
        assert sup.post(f"/api/v1/deliveries/dlv_{ns}_2/replay", body={}).status == 202
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", body={})
        assert r.status == 429, r.text
        assert r.json()["app"] == w["a"] and r.json()["left"] == 0
        assert "2 deliveries per app per hour" in r.json()["error"]
        # another app has its own allowance; an admin is not limited
        assert sup.post(f"/api/v1/deliveries/dlv_{ns}_7/replay", body={}).status == 202
        admin = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        assert admin.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", body={}).status == 202
    assert not [a for a in _audit(settings, f"dlv_{ns}_5") if a[0] == f"support:sup-{ns}"]


def test_bulk_replay_needs_the_previewed_count(settings: Settings, namespace: str) -> None:
    from dataclasses import replace

    ns = namespace
    _ep, app = endpoint_with_deliveries(settings, ns, "bulk", {"dead_lettered": range(100, 105),
                                                               "held": [200]})
    small = replace(settings, console_bulk_confirm_above=2)
    with console_server(small) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        pv = sup.get(f"/api/v1/replays/preview?app={app}").json()
        assert pv["by_status"] == {"dead_lettered": 5, "held": 1}
        assert pv["replayable"] == 5 and pv["needs_confirmation"] is True
        r = sup.post("/api/v1/replays", body={"filter": {"app": app}})
        assert r.status == 409 and r.json()["needs_confirmation"] == 5
        r = sup.post("/api/v1/replays", body={"filter": {"app": app}, "confirm": 4})
        assert r.status == 409
        assert sup.post("/api/v1/replays", body={"filter": {}}).status == 400
        # paging keys select nothing: {"limit": "1"} replayed every delivery of every app,
        # and {"app": a, "limit": "2"} every one of app a
        for paged in ({"limit": "1"}, {"cursor": "1700000000000:dlv_x"},
                      {"app": app, "limit": "2"}):
            r = sup.post("/api/v1/replays", body={"filter": paged, "confirm": 5})
            assert r.status == 400 and "select nothing" in r.text, (paged, r.text)
        # the page flow: preview page -> confirm form carries the count
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        html = page.get(f"/replays/preview?app={app}").text
        assert 'name="confirm" value="5"' in html
        r = sup.post("/api/v1/replays", body={"filter": {"app": app}, "confirm": 5})
        assert r.status == 202, r.text
        assert r.json()["total"] == 5 and r.json()["skipped"] == {"held": 1}
        # queued now: the preview counts them as the replay would skip them
        pv = sup.get(f"/api/v1/replays/preview?app={app}").json()
        assert pv["by_status"] == {"queued": 5, "held": 1} and pv["replayable"] == 0, pv
        assert "Nothing replayable matches" in page.get(f"/replays/preview?app={app}").text
    assert _drain(settings) == 5
    keys = {decode("Delivery", m)["delivery_id"] for m in read_topic(settings, RETRY_5S, 5)}
    assert keys == {f"dlv_{ns}_{100 + i}" for i in range(5)}


def test_edits_are_ssrf_checked_and_nothing_changes_when_refused(
        settings: Settings, namespace: str) -> None:
    from dataclasses import replace

    w = _world(settings, namespace)
    ns = namespace
    strict = replace(settings, allow_loopback_targets=False)

    def lookup(host: str) -> list[str]:
        if host == "internal.test":
            return ["10.1.2.3"]
        if host == "mixed.test":
            return ["93.184.216.34", "169.254.169.254"]
        if host == "public.test":
            return ["93.184.216.34"]
        raise OSError("name does not resolve")

    path = f"/api/v1/deliveries/dlv_{ns}_5/replay"
    with console_server(strict, lookup=lookup) as port:
        # a reviewer may send to another host than the endpoint's own (a support may not:
        # test_console_reach.py), if it passes the SSRF check
        rev = Client(port, bearer=token(settings, f"rev-{ns}", "reviewer"))
        for url, words in [
            ("https://10.0.0.5/hook", "private"),
            ("https://0x7f000001/hook", "loopback"),
            ("https://[::ffff:127.0.0.1]/hook", "loopback"),
            ("https://169.254.169.254/latest/meta-data", "link"),
            # one answer for a name that resolves to a refused address and for one that
            # does not resolve: no telling which internal names exist
            ("https://internal.test/hook", GEN),
            ("https://mixed.test/hook", GEN),
            ("https://nowhere.test/hook", GEN),
            ("ftp://public.test/hook", "scheme"),
        ]:
            r = rev.post(path, body={"override": {"url": url}})
            assert r.status == 400, (url, r.text)
            assert words in r.json()["error"].lower() or words in r.json()["error"], (url, r.text)
            # what a name resolves to is not shown: a token could map internal names
            assert "10.1.2.3" not in r.text and "169.254.169.254/" not in r.text.replace(
                url, ""), r.text
        r = rev.post(path, body={"override": {"url": "https://public.test/hook"}})
        assert r.status == 202, r.text
        assert r.json()["diff"] == [["url", f"https://pub.example/{w['ep_a']}",
                                     "https://public.test/hook"]]
        # the page's first POST shows the diff, the second queues
        page = Client(port)
        page.sign_in(token(settings, f"rev2-{ns}", "reviewer"))
        r = page.post(f"/deliveries/dlv_{ns}_1/replay",
                      form={"url": "https://public.test/other", "csrf": page.csrf})
        assert r.status == 200 and "https://public.test/other" in r.text and "confirm" in r.text
        r = page.post(f"/deliveries/dlv_{ns}_1/replay",
                      form={"url": "https://internal.test/x", "csrf": page.csrf})
        assert r.status == 400 and GEN in r.text
        assert "10.1.2.3" not in r.text

        admin_tok = token(settings, f"adm-{ns}", "admin")
        admin = Client(port, bearer=admin_tok)
        ep_path = f"/api/v1/endpoints/{w['ep_a']}"
        r = admin.post(ep_path, body={"url": "http://internal.test/hook"})
        assert r.status == 422 and any(GEN in p
                                       for p in r.json()["problems"]), r.text
        assert "10.1.2.3" not in r.text
        r = admin.post("/api/v1/endpoints", body={"app_id": w["a"],
                                                  "url": "https://nowhere.test/hook"})
        assert r.status == 422 and any(GEN in p for p in r.json()["problems"]), r.text
        r = admin.post(ep_path, body={"url": "https://public.test/new"})
        assert r.status == 409 and r.json()["step_up"] is True
        code = r.json()["confirmation"]
        r = admin.post(ep_path, body={"url": "https://public.test/new",
                                      "confirmation": "stp_wrong"})
        assert r.status == 403
        r = admin.post(ep_path, body={"config": {"fields": ["no_such_field"]}})
        assert r.status == 422 and "no_such_field" in json.dumps(r.json()["problems"])
        r = admin.post(ep_path, body={"url": "https://public.test/new", "confirmation": code,
                                      "note": "publisher moved"})
        assert r.status == 200, r.text
    with connect(settings.database_url) as conn:
        assert conn.execute("SELECT url FROM endpoints WHERE endpoint_id = %s",
                            (w["ep_a"],)).fetchone() == ("https://public.test/new",)
        jobs = conn.execute("SELECT count(*) FROM replay_items WHERE delivery_id = %s",
                            (f"dlv_{ns}_5",)).fetchone()
    assert jobs == (1,)  # only the accepted edit
    assert [a for _actor, a in _audit(settings, w["ep_a"])] == ["endpoint.update"]
    assert [a for _actor, a in _audit(settings, f"dlv_{ns}_5")] == ["delivery.edit_replay"]
    # a save or a create refused for its URL's address is audited, as a test-send is
    # (a problem of another kind, the unknown field above, is not)
    with connect(settings.database_url) as conn:
        refused = [(r[0], r[1]["status"], GEN in r[1]["reason"]) for r in conn.execute(
            "SELECT target_id, after FROM audit_log WHERE actor = %s"
            " AND action LIKE 'refused.%%' ORDER BY audit_id", (f"admin:adm-{ns}",))]
    assert refused == [(ep_path, 422, True), ("/api/v1/endpoints", 422, True),
                       (ep_path, 403, False)], refused  # (the 403: the wrong code)


def test_bad_input_gets_a_clear_error_and_changes_nothing(
        settings: Settings, namespace: str) -> None:
    _world(settings, namespace)
    ns = namespace
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        r = sup.get(f"/api/v1/deliveries/dlv_{ns}_unknown")
        assert r.status == 404 and "no delivery" in r.json()["error"]
        for q, words in [("status=bogus", "status must be one of"),
                         ("since=last-week", "since must be a date"),
                         ("cursor=garbage", "cursor is malformed"),
                         ("limit=100000", "limit must be"),
                         ("colour=red", "unknown filter")]:
            r = sup.get(f"/api/v1/deliveries?{q}")
            assert r.status == 400 and words in r.json()["error"], (q, r.text)
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_5/replay",
                     body={"override": {"url": "https://x.example/", "fields": ["f" * 9000]}})
        assert r.status == 400 and "larger than 8192 bytes" in r.json()["error"]
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_5/replay",
                     body={"override": {"method": "DELETE"}})
        assert r.status == 400 and "unknown override key" in r.json()["error"]
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", raw=b"{not json",
                     headers={"Content-Type": "application/json"})
        assert r.status == 400 and "not JSON" in r.json()["error"]
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", raw=b"x" * 70_000,
                     headers={"Content-Type": "application/json"})
        assert r.status == 413
        assert sup.post("/api/v1/dead-letters/dl_nope/resolve", body={}).status == 404
        assert sup.post(f"/api/v1/deliveries/dlv_{ns}_1/suppress",
                        body={"reason": "x"}).status == 409  # delivered: not poison

        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        r = page.get("/deliveries?status=bogus")
        assert r.status == 400 and "status must be one of" in r.text
        r = page.get(f"/deliveries/dlv_{ns}_unknown")
        assert r.status == 404 and "no delivery" in r.text
    with connect(settings.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM replay_items WHERE delivery_id LIKE %s",
                            (f"dlv_{ns}_%",)).fetchone() == (0,)
    assert topic_size(settings, RETRY_5S) == 0


def test_the_drainer_publishes_at_the_per_endpoint_cap(settings: Settings, namespace: str) -> None:
    from dataclasses import replace

    from replay_console.actions import create_replay
    from replay_console.auth import Principal

    ns = namespace
    s = replace(settings, console_replay_rate_per_endpoint=4.0, console_replay_rate_total=100.0)
    eps = {"x": f"ep_{ns}_x", "y": f"ep_{ns}_y"}
    with connect(s.database_url) as conn:
        for ep in eps.values():
            upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{ns}", url="https://p.example/")
        conn.commit()
    insert_deliveries(s, [held_delivery(ns, i, endpoint=eps["x"]) for i in range(10)],
                      status="delivered")
    insert_deliveries(s, [held_delivery(ns, 100 + i, endpoint=eps["y"]) for i in range(3)],
                      status="delivered")
    now = [1000.0]
    admin = Principal("tok_test", "bulk", "admin", ())
    with connect(s.database_url) as conn:
        from replay_console.queries import DeliveryFilter

        job = create_replay(conn, s, admin, flt=DeliveryFilter(app=f"app_{ns}"), confirm=13)
        conn.commit()
        drainer = Drainer(s, clock=lambda: now[0])
        per_tick = []
        for _ in range(12):
            per_tick.append(drainer.tick(conn))
            conn.commit()
            now[0] += 0.25  # one token per endpoint per quarter second (4/s)
        drainer.last -= 5.0  # a long pause banks half a second's worth, not five seconds'
        drainer._refill()
        assert drainer.total_tokens == 50.0 and drainer.burst == 2.0
    assert job.total == 13
    # half a second's worth at first (x 2, y 2), then one per endpoint per quarter second
    assert per_tick == [4, 2, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
    published = [decode("Delivery", m) for m in read_topic(s, RETRY_5S, 13)]
    assert len({d["delivery_id"] for d in published}) == 13
    assert all(d["triggered_by"] == "admin:bulk" for d in published)


def test_cli_parity_list_show_replay(settings: Settings, namespace: str,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    w = _world(settings, namespace)
    ns = namespace
    assert run_cli(monkeypatch, settings, "deliveries", "list", "--app", w["a"],
                   "--status", "dead_lettered", "--json") == 0
    assert _ids(json.loads(capsys.readouterr().out)["deliveries"]) == {f"dlv_{ns}_5"}
    assert run_cli(monkeypatch, settings, "deliveries", "list", "--status", "nope") == 2
    assert "status must be one of" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "deliveries", "show", f"dlv_{ns}_5") == 0
    out = capsys.readouterr().out
    assert w["d5"]["idempotency_key"] in out and "dead_lettered" in out
    assert run_cli(monkeypatch, settings, "deliveries", "show", f"dlv_{ns}_zz") == 1
    assert run_cli(monkeypatch, settings, "deliveries", "replay", f"dlv_{ns}_5",
                   "--actor", "carol", "--note", "from the CLI") == 0
    captured = capsys.readouterr()
    assert "1/1 published" in captured.out and "published 1/1" in captured.err
    [m] = read_topic(settings, RETRY_5S, 1)
    d = decode("Delivery", m)
    assert (d["delivery_id"], d["triggered_by"], d["idempotency_key"]) == (
        f"dlv_{ns}_5", "support:cli:carol", w["d5"]["idempotency_key"])
    assert run_cli(monkeypatch, settings, "deliveries", "replay", f"dlv_{ns}_3",
                   "--actor", "carol") == 1
    assert "held" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "deliveries", "replay", "--actor", "carol") == 2
    # a replay by nobody: refused (it was audited as cli)
    assert run_cli(monkeypatch, settings, "deliveries", "replay", f"dlv_{ns}_5") == 2
    assert "--actor NAME is required" in capsys.readouterr().err
    assert run_cli(monkeypatch, settings, "deliveries", "replay", f"dlv_{ns}_5",
                   "--actor", "") == 2  # (an unset "$USER")
    assert "--actor" in capsys.readouterr().err
    # an actor that would forge an audit line: refused before anything is done
    assert run_cli(monkeypatch, settings, "deliveries", "replay", f"dlv_{ns}_5",
                   "--actor", "carol\nadmin:root") == 2
    assert "without control characters" in capsys.readouterr().err


def test_cli_bulk_edit_and_replay_with_yes_keeps_the_edit(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--yes`` confirms a bulk replay's count: the edit goes with it (it used to be
    dropped on the confirming call, so every delivery went to the old URL again)."""
    w = _world(settings, namespace)
    url = f"https://1.1.1.1/{w['ep_a']}/moved"  # a public literal: no lookup (no agent runs)
    monkeypatch.setenv("POSTBACKS_CONSOLE_BULK_CONFIRM_ABOVE", "1")  # 2 need confirming
    assert run_cli(monkeypatch, settings, "deliveries", "replay", "--app", w["a"],
                   "--status", "delivered", "--url", url, "--role", "reviewer",
                   "--actor", "carol", "--yes") == 0
    assert "url:" in capsys.readouterr().err  # the edit's diff is shown
    published = [decode("Delivery", m) for m in read_topic(settings, RETRY_5S, 2)]
    assert {d["delivery_id"] for d in published} == {f"dlv_{namespace}_1",
                                                     f"dlv_{namespace}_2"}
    assert all(json.loads(d["override"] or "{}").get("url") == url for d in published), published


def test_rotation_test_send_and_dead_letter_resolution(
        settings: Settings, namespace: str, stack: Any) -> None:
    from postbacks.core.signing import generate_secret
    from postbacks.tools.procs import free_port, http_json, wait_for

    w = _world(settings, namespace)
    ns = namespace
    rport = free_port()
    stack.start("receiver", "receiver", "--port", str(rport))
    rbase = f"http://127.0.0.1:{rport}"
    wait_for(lambda: http_json(f"{rbase}/_control/stats"), 30, what="receiver")
    old, new = generate_secret(), generate_secret()
    http_json(f"{rbase}/_control/secrets", {w["ep_a"]: [new]})  # verifies with the new one
    insert_dead_letter(settings, ns, w["ep_a"])
    with console_server(settings) as port:
        admin_tok = token(settings, f"adm-{ns}", "admin")
        admin = Client(port, bearer=admin_tok)
        ep_path = f"/api/v1/endpoints/{w['ep_a']}"
        assert admin.post(f"{ep_path}/secrets", body={"secret": "not-a-secret"}).status == 400
        assert admin.post(f"{ep_path}/secrets", body={"secret": old}).status == 200
        r = admin.post(f"{ep_path}/secrets", body={"secret": new, "overlap_s": 3600})
        assert r.status == 200, r.text
        secrets = admin.get(ep_path).json()["secrets"]
        assert len(secrets) == 2 and all(s["active"] for s in secrets)
        assert "ciphertext" not in json.dumps(secrets) and new not in admin.get(ep_path).text
        # test-send: real render + sign + transport, both signatures, the exact bytes back
        r = admin.post(f"{ep_path}/test-send",
                       body={"override": {"url": f"{rbase}/hooks/{w['ep_a']}"}})
        assert r.status == 200, r.text
        sent = r.json()
        assert sent["ok"] and sent["response"]["status"] == 200
        assert sent["request"]["headers"]["webhook-signature"].count("v1,") == 2
        assert json.loads(sent["request"]["body"])["type"] == "conversion"
        [got] = http_json(f"{rbase}/_control/received?endpoint={w['ep_a']}")
        assert got["signature"] == "ok" and got["body"] == sent["request"]["body"]
        r = admin.post(f"{ep_path}/test-send", body={"override": {"url": "http://10.9.9.9/"}})
        assert r.status == 400 and "private" in r.json()["error"]
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        assert sup.post(f"{ep_path}/secrets", body={"secret": new}).status == 403
        # dead letters: resolve once, audited; twice is refused
        assert f"dl_{ns}" in {x["dead_letter_id"] for x in
                              sup.get("/api/v1/dead-letters").json()["dead_letters"]}
        assert sup.post(f"/api/v1/dead-letters/dl_{ns}/resolve",
                        body={"note": "publisher fixed it"}).status == 200
        assert sup.post(f"/api/v1/dead-letters/dl_{ns}/resolve", body={}).status == 409
        metrics = Client(port).get("/metrics").text  # public, like every process's /metrics
        assert 'postbacks_console_actions_total{action="test_send",result="ok"}' in metrics
        # a refusal (the SSRF-refused test-send above, the support's 403) is counted too
        assert 'postbacks_console_actions_total{action="test_send",result="refused"}' \
            in metrics
        assert 'postbacks_console_actions_total{action="rotate_secret",result="refused"}' \
            in metrics
        assert 'postbacks_console_actions_total{action="resolve_dead_letter",result="ok"}' \
            in metrics
        assert 'postbacks_console_request_seconds_count{route="/api/v1/endpoints/{id}/' \
            'test-send",status="4xx"}' in metrics
        assert f"dl_{ns}" not in {x["dead_letter_id"] for x in
                                  sup.get("/api/v1/dead-letters").json()["dead_letters"]}
    assert [a for _x, a in _audit(settings, w["ep_a"])] == [
        "endpoint.rotate_secret", "endpoint.rotate_secret", "endpoint.test_send"]
    assert _audit(settings, f"dl_{ns}") == [(f"support:sup-{ns}", "dead_letter.resolve")]


def test_sign_in_is_hardened(settings: Settings, namespace: str) -> None:
    import hashlib

    from postbacks.settings import _DEV_SECRETS_KEY
    from replay_console.auth import session_cookie

    ns = namespace
    tok = token(settings, f"adm-{ns}", "admin")
    with console_server(settings) as port:
        c = Client(port)
        for nxt in ("/\\evil.example/x", "/\tevil.example", "//evil.example",
                    "https://evil.example/", "/\r\nSet-Cookie: x=1", "javascript:alert(1)"):
            r = c.post("/login", form={"token": tok, "next": nxt})
            assert r.status == 303 and r.headers["location"] == "/deliveries", nxt
        r = c.post("/login", form={"token": tok, "next": "/deliveries?status=held"})
        assert r.headers["location"] == "/deliveries?status=held"
        r = Client(port).post("/login", form={"token": tok},
                              headers={"Origin": "https://evil.example"})
        assert r.status == 403
        r = Client(port).post("/login", form={"token": tok},
                              headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status == 403
        # the session key is not derived from the (public) development secrets key
        from postbacks.db.connect import connect as pg

        with pg(settings.database_url) as conn:
            tid = conn.execute("SELECT token_id FROM console_tokens WHERE name = %s",
                               (f"adm-{ns}",)).fetchone()[0]
        forged = session_cookie(
            hashlib.sha256(b"postbacks-console|" + _DEV_SECRETS_KEY.encode()).digest(), tid)
        assert Client(port, cookie=forged).get("/api/v1/deliveries").status == 401
        bad = Client(port, cookie=c.cookie + "0")
        assert bad.get("/api/v1/deliveries").status == 401


def test_no_dns_answer_or_header_value_reaches_the_wrong_role(
        settings: Settings, namespace: str) -> None:
    w = _world(settings, namespace)
    ns = namespace
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=w["ep_a"], app_id=w["a"],
                        url=f"https://pub.example/{w['ep_a']}",
                        config=EndpointConfig.from_json(
                            {"headers": {"X-Api-Key": "sekrit-header-value"}}))
        conn.commit()
    asked: list[str] = []

    def lookup(host: str) -> list[str]:
        asked.append(host)
        return ["10.1.2.3"]

    with console_server(settings, lookup=lookup) as port:
        pub = Client(port)
        pub.sign_in(token(settings, f"pub-{ns}", "publisher", (w["a"],)))
        r = pub.post(f"/deliveries/dlv_{ns}_1/replay",
                     form={"url": "http://intranet.test/", "csrf": pub.csrf})
        assert r.status == 403 and "10.1.2.3" not in r.text
        r = pub.post(f"/endpoints/{w['ep_a']}/test-send",
                     form={"url": "http://intranet.test/", "csrf": pub.csrf})
        assert r.status == 403 and "10.1.2.3" not in r.text
        assert asked == []
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        assert "sekrit-header-value" not in sup.get(f"/api/v1/endpoints/{w['ep_a']}").text
        admin_tok = token(settings, f"adm-{ns}", "admin")
        admin = Client(port, bearer=admin_tok)
        assert "sekrit-header-value" in admin.get(f"/api/v1/endpoints/{w['ep_a']}").text
        r = admin.post(f"/api/v1/endpoints/{w['ep_a']}",
                       body={"config": {"headers": {"X-Api-Key": "new-sekrit"}}})
        assert r.status == 200, r.text
        trail = sup.get(f"/api/v1/audit?target_id={w['ep_a']}").text
        assert "sekrit" not in trail
        assert "(changed)" in trail  # the rotation shows in the audit, not its value
        # nor in the exact request a test-send shows (masked by name, for every role)
        from postbacks.core.signing import generate_secret

        assert admin.post(f"/api/v1/endpoints/{w['ep_a']}/secrets",
                          body={"secret": generate_secret()}).status == 200
        r = sup.post(f"/api/v1/endpoints/{w['ep_a']}/test-send", body={})
        assert r.status == 200, r.text
        assert r.json()["request"]["headers"]["X-Api-Key"] == "[redacted]", r.text
        assert "new-sekrit" not in r.text


def test_json_booleans_promote_and_release_all(settings: Settings, namespace: str) -> None:
    w = _world(settings, namespace)
    ns = namespace

    def lookup(host: str) -> list[str]:
        return ["93.184.216.34"]

    with console_server(settings, lookup=lookup) as port:
        admin_tok = token(settings, f"adm-{ns}", "admin")
        admin = Client(port, bearer=admin_tok)
        edit = {"override": {"url": "https://moved.test/h"}, "promote": True}
        r = admin.post(f"/api/v1/deliveries/dlv_{ns}_5/replay", body=edit)
        assert r.status == 409 and r.json()["step_up"] is True, r.text
        r = admin.post(f"/api/v1/deliveries/dlv_{ns}_5/replay",
                       body={**edit, "confirmation": r.json()["confirmation"]})
        assert r.status == 202, r.text
        assert admin.get(f"/api/v1/endpoints/{w['ep_a']}").json()["url"] == \
            "https://moved.test/h"
        rev = Client(port, bearer=token(settings, f"rev-{ns}", "reviewer"))
        r = rev.post("/api/v1/held/reject", body={"app": w["a"], "note": "fraud"})
        assert r.status == 200 and r.json()["delivery_ids"] == [f"dlv_{ns}_3"], r.text
    assert [a for _x, a in _audit(settings, w["ep_a"])] == ["endpoint.update"]


def test_a_promote_refused_at_its_second_lookup_is_audited(
        settings: Settings, namespace: str) -> None:
    """An edit & replay with promote looks the URL up twice: for the edit, then for the
    endpoint's save. A name that answers a public address first and an internal one after
    (DNS rebinding) is refused at the save, and that refusal is audited too."""
    from dataclasses import replace

    w = _world(settings, namespace)
    ns = namespace
    asked: list[str] = []

    def lookup(host: str) -> list[str]:
        asked.append(host)  # per request: the edit's lookup, then the save's
        return ["10.1.2.3"] if len(asked) >= 4 else ["93.184.216.34"]

    path = f"/api/v1/deliveries/dlv_{ns}_5/replay"
    strict = replace(settings, allow_loopback_targets=False)
    with console_server(strict, lookup=lookup) as port:
        admin = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        edit = {"override": {"url": "https://rebind.test/h"}, "promote": True}
        r = admin.post(path, body=edit)
        assert r.status == 409 and r.json()["step_up"] is True, r.text
        r = admin.post(path, body={**edit, "confirmation": r.json()["confirmation"]})
        assert r.status == 400 and "promote refused" in r.json()["error"], r.text
        assert "10.1.2.3" not in r.text
    assert asked == ["rebind.test"] * 4
    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "SELECT action, after->>'status' FROM audit_log WHERE actor = %s"
            " AND target_id = %s", (f"admin:adm-{ns}", path)).fetchall()
        url = conn.execute("SELECT url FROM endpoints WHERE endpoint_id = %s",
                           (w["ep_a"],)).fetchone()
    assert rows == [("refused.edit_replay", "400")], rows
    assert url == (f"https://pub.example/{w['ep_a']}",)  # not saved


def test_the_held_page_says_when_it_leaves_cohorts_and_holds_out(
        settings: Settings, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The held page shows the oldest holds first, at most HELD_PAGE_LIMIT cohorts and
    deliveries; past that it says more are held and how to see them (a newer cohort left
    off the page without a word looks resolved)."""
    import replay_console.reads as reads_module

    w = _world(settings, namespace)  # app a: one held delivery (d3), "retrodated"
    more = held_delivery(namespace, 9, endpoint=w["ep_a"], app=w["a"])
    insert_deliveries(settings, [more], reason="payout_rate_endpoint")
    monkeypatch.setattr(reads_module, "HELD_PAGE_LIMIT", 1)
    with console_server(settings) as port:
        rev = Client(port, bearer=token(settings, f"rev-{namespace}", "reviewer"))
        body = rev.get(f"/api/v1/held?app={w['a']}").json()
        assert body["more"] == {"held": True, "cohorts": True}
        assert len(body["cohorts"]) == 1 and len(body["held"]) == 1
        page = rev.get(f"/held?app={w['a']}").text
        assert 'id="cohorts-more"' in page and 'id="held-more"' in page
        monkeypatch.setattr(reads_module, "HELD_PAGE_LIMIT", 2)  # exactly all: no notice
        body = rev.get(f"/api/v1/held?app={w['a']}").json()
        assert body["more"] == {"held": False, "cohorts": False}
        assert {c["hold_reason"] for c in body["cohorts"]} == {"retrodated",
                                                               "payout_rate_endpoint"}
        page = rev.get(f"/held?app={w['a']}").text
        assert "cohorts-more" not in page and "held-more" not in page


def test_more_bad_input_is_a_400_not_a_500(settings: Settings, namespace: str) -> None:
    w = _world(settings, namespace)
    ns = namespace
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        for q in ("limit=%C2%B2", "cursor=9999999999999999:x",
                  "since=0001-01-01T00:00:00%2B14:00", "until=9999-12-31"):
            r = sup.get(f"/api/v1/deliveries?{q}")
            assert r.status == 400, (q, r.text)
        r = sup.post("/api/v1/replays", body={"filter": {"app": w["a"]}, "confirm": "²"})
        assert r.status == 400
        admin = Client(port, bearer=token(settings, f"adm-{ns}", "admin"))
        r = admin.post(f"/api/v1/endpoints/{w['ep_a']}/secrets",
                       body={"secret": "whsec_" + "A" * 43 + "=", "overlap_s": 10**20})
        assert r.status == 400
        # failing/quarantined deliveries still have a live retry chain: not replayed
        insert_deliveries(settings, [held_delivery(ns, 50, endpoint=w["ep_a"], app=w["a"])],
                          status="failing")
        r = sup.post(f"/api/v1/deliveries/dlv_{ns}_50/replay", body={})
        assert r.status == 409 and "in flight" in r.json()["error"]


def test_the_drainer_rechecks_status_before_publishing(settings: Settings, namespace: str
                                                       ) -> None:
    from dataclasses import replace

    w = _world(settings, namespace)
    ns = namespace
    s = replace(settings, console_replay_per_app_hour=0)
    with console_server(s) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        r = sup.post("/api/v1/replays", body={"delivery_ids": [f"dlv_{ns}_5", f"dlv_{ns}_1"]})
        assert r.status == 202, r.text
        job = r.json()["job_id"]
        with connect(settings.database_url) as conn:  # held by a validator meanwhile
            conn.execute("UPDATE deliveries SET status = 'held' WHERE delivery_id = %s",
                         (f"dlv_{ns}_5",))
            conn.commit()
        assert _drain(s) == 1
        status = sup.get(f"/api/v1/replays/{job}").json()
        assert status["state"] == "done" and status["published"] == 1
        assert status["not_published"] == 1
        assert status["not_published_examples"] == [
            {"delivery_id": f"dlv_{ns}_5", "error": "not replayed: it is now held"}]
    [m] = read_topic(settings, RETRY_5S, 1)
    assert decode("Delivery", m)["delivery_id"] == f"dlv_{ns}_1"
    del w
