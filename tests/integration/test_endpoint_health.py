"""Per-endpoint health in the console (``/api/v1/endpoints``, ``/endpoints``,
``/api/v1/endpoints/{id}/health``) against the real console and PostgreSQL: every state
from seeded endpoints, attempts, outcomes and anomaly halts; the publisher scope (its own
endpoints, never a halt or a held count); bad query parameters; paging."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.db import anomaly as db_anomaly
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from tests.integration.console_util import Client, console_server, token


def _ago(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)


def _attempts(conn: psycopg.Connection[Any], ep: str, results: list[str], *,
              ago_s: float) -> None:
    for i, result in enumerate(results):
        conn.execute(
            "INSERT INTO delivery_attempts (attempt_id, attempted_at, delivery_id, endpoint_id,"
            " idempotency_key, attempt_no, trigger, result, status_code, queue_ms, platform_ms,"
            " wire_ms, request_method, request_url, request_headers)"
            " VALUES (%s, %s, %s, %s, %s, 1, 'initial', %s, %s, 0, 0, 0, 'POST', %s, %s)",
            (f"att_{uuid.uuid4().hex}", _ago(ago_s + i), f"dlv_{ep}_{i}", ep, f"msg_{ep}_{i}",
             result, 200 if result == "delivered" else 503, f"https://pub.example/{ep}",
             Jsonb({})),
        )


def _outcome(conn: psycopg.Connection[Any], ep: str, app: str, kind: str, *,
             ago_s: float) -> None:
    conn.execute(
        "INSERT INTO delivery_outcomes (outcome_id, delivery_id, endpoint_id, app_id, kind,"
        " attempt_no, occurred_at) VALUES (%s, %s, %s, %s, %s, 1, %s)",
        (f"out_{uuid.uuid4().hex}", f"dlv_{ep}_q", ep, app, kind, _ago(ago_s)),
    )


def _trip(conn: psycopg.Connection[Any], ep: str) -> None:
    assert db_anomaly.record_trip(
        conn, scope="endpoint", scope_key=ep, detector="value_rate", reason="test halt",
        observed=None, baseline=None, at_ms=int(time.time() * 1000))


def _world(settings: Settings, ns: str) -> dict[str, str]:
    """App a: one endpoint per state (and two that only look close to one); app b: one."""
    w = {"a": f"app_{ns}_a", "b": f"app_{ns}_b"}
    for name in ("healthy", "degraded", "few", "quar", "oldquar", "halt", "off"):
        w[name] = f"ep_{ns}_a_{name}"
    w["other"] = f"ep_{ns}_b_other"
    window = settings.breaker_open_s
    with connect(settings.database_url) as conn:
        for key in ("healthy", "degraded", "few", "quar", "oldquar", "halt", "off"):
            upsert_endpoint(conn, endpoint_id=w[key], app_id=w["a"],
                            url=f"https://pub.example/{w[key]}", name=f"{key} endpoint")
        upsert_endpoint(conn, endpoint_id=w["other"], app_id=w["b"],
                        url="https://pub.example/other")
        conn.execute("UPDATE endpoints SET enabled = false WHERE endpoint_id = %s", (w["off"],))
        # healthy: 11 of 12 in the last hour (0.917 is not below 0.9); 2 more delivered three
        # hours ago; a failure 30 h ago is outside every window.
        _attempts(conn, w["healthy"], ["delivered"] * 11 + ["retryable"], ago_s=60)
        _attempts(conn, w["healthy"], ["delivered"] * 2, ago_s=3 * 3600)
        _attempts(conn, w["healthy"], ["retryable"], ago_s=30 * 3600)
        # degraded: 8 of 10 in the last hour
        _attempts(conn, w["degraded"], ["delivered"] * 8 + ["retryable"] * 2, ago_s=60)
        # few: every attempt failed, but 9 are too few to call it degraded
        _attempts(conn, w["few"], ["retryable"] * 9, ago_s=60)
        _attempts(conn, w["other"], ["delivered"], ago_s=60)
        _outcome(conn, w["quar"], w["a"], "quarantined", ago_s=window / 5)
        _outcome(conn, w["oldquar"], w["a"], "quarantined", ago_s=window * 3)
        # halt: tripped and quarantined; off: disabled wins over its trip
        _outcome(conn, w["halt"], w["a"], "quarantined", ago_s=window / 5)
        _trip(conn, w["halt"])
        _trip(conn, w["off"])
        conn.commit()
    n = 0
    for ep, statuses in ((w["halt"], ("held", "held", "failing", "delivered", "pending")),
                         (w["healthy"], ("delivered", "dead_lettered", "exhausted",
                                         "rejected", "suppressed", "replayed"))):
        for status in statuses:
            n += 1
            insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep, app=w["a"])],
                              status=status)
    return w


def _by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["endpoint_id"]: r for r in rows}


def test_every_state_and_its_numbers_as_staff_see_them(settings: Settings,
                                                       namespace: str) -> None:
    w = _world(settings, namespace)
    with console_server(settings) as port:
        support = Client(port, bearer=token(settings, f"sup-{namespace}", "support"))
        r = support.get(f"/api/v1/endpoints?app_id={w['a']}")
        assert r.status == 200, r.text
        body = r.json()
        assert body["next_offset"] is None and body["limit"] == 100 and body["offset"] == 0
        rows = _by_id(body["endpoints"])
        assert list(rows) == sorted(w[k] for k in ("healthy", "degraded", "few", "quar",
                                                   "oldquar", "halt", "off"))
        assert {k: rows[w[k]]["state"] for k in ("healthy", "degraded", "few", "quar",
                                                 "oldquar", "halt", "off")} == {
            "healthy": "healthy", "degraded": "degraded", "few": "healthy",
            "quar": "quarantined", "oldquar": "healthy", "halt": "halted", "off": "disabled"}

        h = rows[w["healthy"]]
        assert h["attempts"] == {"1h": 12, "24h": 14}
        assert h["success_rate"]["1h"] == 11 / 12 and h["success_rate"]["24h"] == 13 / 14
        now_ms = time.time() * 1000
        # the newest success is ~60 s old, the only failure in 24 h ~71 s old
        assert now_ms - 120_000 < h["last_success_at_ms"] < now_ms
        assert now_ms - 120_000 < h["last_failure_at_ms"] < h["last_success_at_ms"]
        assert h["breaker"] == "closed" and h["halted"] is False
        assert h["backlog"] == 1 and h["held"] == 0  # only "replayed" is not settled

        d = rows[w["degraded"]]
        assert d["success_rate"] == {"1h": 0.8, "24h": 0.8}
        few = rows[w["few"]]
        assert few["success_rate"]["1h"] == 0.0 and few["last_success_at_ms"] is None

        q = rows[w["quar"]]
        assert q["breaker"] == "open" and q["success_rate"] == {"1h": None, "24h": None}
        assert q["last_success_at_ms"] is None and q["last_failure_at_ms"] is None
        assert rows[w["oldquar"]]["breaker"] == "closed"

        halt = rows[w["halt"]]
        assert halt["breaker"] == "open" and halt["halted"] is True
        assert halt["backlog"] == 4 and halt["held"] == 2  # held x2, failing, pending
        assert rows[w["off"]]["halted"] is True  # tripped, yet disabled comes first

        # one endpoint: the same row
        one = support.get(f"/api/v1/endpoints/{w['halt']}/health")
        assert one.status == 200 and one.json() == halt
        for state, key in (("degraded", "degraded"), ("halted", "halt"),
                           ("disabled", "off"), ("quarantined", "quar")):
            got = support.get(f"/api/v1/endpoints?app_id={w['a']}&state={state}").json()
            assert [e["endpoint_id"] for e in got["endpoints"]] == [w[key]], state
        got = support.get(f"/api/v1/endpoints?app_id={w['a']}&state=healthy").json()
        assert {e["endpoint_id"] for e in got["endpoints"]} == {
            w["healthy"], w["few"], w["oldquar"]}
        # without an app filter staff see every app's endpoints
        seen: set[str] = set()
        offset: int | None = 0
        while offset is not None:
            page = support.get(f"/api/v1/endpoints?limit=500&offset={offset}").json()
            seen |= {e["endpoint_id"] for e in page["endpoints"]}
            offset = page["next_offset"]
        assert {w["other"], w["healthy"], w["halt"]} <= seen

        assert support.get("/api/v1/endpoints/ep_nope_nothing/health").status == 404


def test_the_page_links_each_endpoint_and_filters_by_state(settings: Settings,
                                                           namespace: str) -> None:
    w = _world(settings, namespace)
    with console_server(settings) as port:
        staff = Client(port)
        staff.sign_in(token(settings, f"sup-{namespace}", "support"))
        r = staff.get(f"/endpoints?app_id={w['a']}")
        assert r.status == 200 and r.headers["content-type"].startswith("text/html")
        for key in ("healthy", "halt", "off"):
            assert f'<a href="/endpoints/{w[key]}">{w[key]}</a>' in r.text
        assert '<select name="state">' in r.text and '<option value="halted"' in r.text
        assert f'<a href="/held?endpoint={w["halt"]}">2</a>' in r.text
        assert "91.7%" in r.text and "80.0%" in r.text
        assert "<script" not in r.text and " style=" not in r.text
        # the linked page exists
        assert staff.get(f"/endpoints/{w['halt']}").status == 200
        r = staff.get(f"/endpoints?app_id={w['a']}&state=degraded")
        assert w["degraded"] in r.text and w["healthy"] not in r.text
        r = staff.get(f"/endpoints?app_id={w['a']}&limit=2")
        assert 'id="next"' in r.text and "offset=2" in r.text and 'id="prev"' not in r.text
        r = staff.get(f"/endpoints?app_id={w['a']}&limit=2&offset=6")
        assert 'id="prev"' in r.text and 'id="next"' not in r.text
        r = staff.get("/endpoints?limit=9999")
        assert r.status == 400 and "limit must be a whole number from 1 to 500" in r.text


def test_a_publisher_sees_its_own_endpoints_and_never_a_halt(settings: Settings,
                                                             namespace: str) -> None:
    w = _world(settings, namespace)
    with console_server(settings) as port:
        pub = Client(port, bearer=token(settings, f"pub-{namespace}", "publisher", (w["a"],)))
        r = pub.get("/api/v1/endpoints?limit=500")
        assert r.status == 200, r.text
        rows = _by_id(r.json()["endpoints"])
        assert set(rows) == {w[k] for k in ("healthy", "degraded", "few", "quar", "oldquar",
                                             "halt", "off")}
        for row in rows.values():
            assert "held" not in row and "halted" not in row
            assert row["state"] != "halted"
        halt = rows[w["halt"]]
        assert halt["state"] == "quarantined"  # what it would be without the halt
        assert halt["backlog"] == 1  # the failing one: held and pending are not its to see
        assert rows[w["off"]]["state"] == "disabled"
        assert rows[w["degraded"]]["state"] == "degraded"

        one = pub.get(f"/api/v1/endpoints/{w['halt']}/health")
        assert one.status == 200 and one.json() == halt
        assert pub.get(f"/api/v1/endpoints/{w['other']}/health").status == 404
        assert pub.get(f"/api/v1/endpoints?app_id={w['b']}").json()["endpoints"] == []
        r = pub.get("/api/v1/endpoints?state=halted")
        assert r.status == 400
        assert "state must be one of healthy, degraded, quarantined, disabled, not" in \
            r.json()["error"]
        got = pub.get("/api/v1/endpoints?state=quarantined").json()["endpoints"]
        assert {e["endpoint_id"] for e in got} == {w["quar"], w["halt"]}

        page = Client(port)
        page.sign_in(token(settings, f"pub2-{namespace}", "publisher", (w["a"],)))
        html = page.get("/endpoints").text
        assert w["halt"] in html and w["other"] not in html
        assert "halted" not in html and "<th>Held</th>" not in html
        assert f'href="/endpoints/{w["halt"]}"' not in html  # that page is staff-only


def test_bad_query_parameters_are_a_400_naming_them(settings: Settings,
                                                    namespace: str) -> None:
    with console_server(settings) as port:
        c = Client(port, bearer=token(settings, f"sup-{namespace}", "support"))
        for query, words in (
            ("limit=0", "limit must be a whole number from 1 to 500"),
            ("limit=501", "limit must be a whole number from 1 to 500"),
            ("limit=ten", "limit must be a whole number"),
            ("limit=%EF%BC%93", "limit must be a whole number"),  # a full-width digit
            ("offset=-1", "offset must be a whole number from 0"),
            ("offset=99999999999", "offset must be a whole number from 0"),
            ("state=sick", "state must be one of healthy, degraded"),
            ("app_id=no%20spaces", "app_id 'no spaces' is not a valid id"),
            ("colour=red", "unknown parameter(s): colour"),
            ("limit=1&limit=2", "limit given 2 times"),
        ):
            r = c.get(f"/api/v1/endpoints?{query}")
            assert r.status == 400, (query, r.status, r.text)
            assert words in r.json()["error"], (query, r.json())
        r = c.get("/api/v1/endpoints/ep_x/health?verbose=1")
        assert r.status == 400 and "no query parameters" in r.json()["error"]
        assert c.get("/api/v1/endpoints/bad%20id/health").status == 404
        assert Client(port).get("/api/v1/endpoints").status == 401


def test_paging_walks_every_endpoint_once(settings: Settings, namespace: str) -> None:
    app = f"app_{namespace}_p"
    eps = [f"ep_{namespace}_p{i:02d}" for i in range(7)]
    with connect(settings.database_url) as conn:
        for ep in eps:
            upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=f"https://pub.example/{ep}")
        conn.commit()
    with console_server(settings) as port:
        c = Client(port, bearer=token(settings, f"sup-{namespace}", "support"))
        got: list[str] = []
        offsets: list[int] = []
        offset: int | None = 0
        while offset is not None:
            offsets.append(offset)
            body = c.get(f"/api/v1/endpoints?app_id={app}&limit=3&offset={offset}").json()
            assert body["limit"] == 3 and body["offset"] == offset
            got += [e["endpoint_id"] for e in body["endpoints"]]
            offset = body["next_offset"]
        assert got == eps and offsets == [0, 3, 6]
        past = c.get(f"/api/v1/endpoints?app_id={app}&limit=3&offset=7").json()
        assert past["endpoints"] == [] and past["next_offset"] is None
        exact = c.get(f"/api/v1/endpoints?app_id={app}&limit=7").json()
        assert len(exact["endpoints"]) == 7 and exact["next_offset"] is None
