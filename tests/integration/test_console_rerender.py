"""Fix once, re-render many, and resolving suppressions, against the real console,
PostgreSQL and Kafka: deliveries whose endpoint URL template named an unknown macro are
suppressed render failures; the preview renders them with the endpoint's current config
(still failing, then rendering once the template is fixed); the replay queues them through
the bulk-replay machinery (confirmation, audit, suppressions resolved) and the drainer
publishes them; a suppression is resolved on its own, audited, once."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, upsert_endpoint
from postbacks.settings import Settings
from replay_console.drain import Drainer
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from tests.integration.console_util import Client, console_server, token
from tests.kafka_util import decode, read_topic
from topics import TOPICS

RETRY_5S = TOPICS.retry_tier("5s").base


def _endpoint(settings: Settings, ep: str, app: str, url: str) -> None:
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=url, provider="v2",
                        method="GET")
        conn.commit()


def _suppress(settings: Settings, ids: list[str], ep: str, reason: str) -> None:
    """As the sink records an agent's ``suppressed`` outcome (render failure)."""
    with connect(settings.database_url) as conn:
        for did in ids:
            conn.execute("INSERT INTO postback_suppressions (delivery_id, endpoint_id, reason)"
                         " VALUES (%s, %s, %s)", (did, ep, reason))
        conn.commit()


def _audit(settings: Settings, target_id: str) -> list[tuple[str, str]]:
    with connect(settings.database_url) as conn:
        return [(r[0], r[1]) for r in conn.execute(
            "SELECT actor, action FROM audit_log WHERE target_id = %s ORDER BY audit_id",
            (target_id,))]


def _drain(settings: Settings) -> int:
    drainer = Drainer(settings)
    total = 0
    deadline = time.monotonic() + 30
    with connect(settings.database_url) as conn:
        while time.monotonic() < deadline:
            total += drainer.tick(conn)
            conn.commit()
            if drainer.pending(conn) == 0:
                conn.commit()
                return total
            drainer.last -= 1.0  # a second later: the buckets refill
    raise AssertionError("the drainer did not finish within 30 s")


def test_fix_once_rerender_many(settings: Settings, namespace: str) -> None:
    ns = namespace
    ep, app = f"ep_{ns}_rr", f"app_{ns}_rr"
    base = "https://pub.example/cb"
    _endpoint(settings, ep, app, f"{base}?c={{conversion_id}}&x={{no_such_macro}}")
    with connect(settings.database_url) as conn:
        add_secret(conn, SecretBox(settings.secrets_key.reveal()), ep, generate_secret(),
                   now_ms=int(time.time() * 1000))
        conn.commit()
    broken = [held_delivery(ns, 10 + i, endpoint=ep, app=app) for i in range(3)]
    insert_deliveries(settings, broken, status="suppressed")
    _suppress(settings, [d["delivery_id"] for d in broken], ep,
              "render_failed: unknown macro {no_such_macro}")
    dead = held_delivery(ns, 20, endpoint=ep, app=app)
    insert_deliveries(settings, [dead], status="dead_lettered")
    done_ = held_delivery(ns, 21, endpoint=ep, app=app)
    insert_deliveries(settings, [done_], status="delivered")
    poison = held_delivery(ns, 22, endpoint=ep, app=app)  # suppressed by hand: stays out
    insert_deliveries(settings, [poison], status="dead_lettered")
    _suppress(settings, [poison["delivery_id"]], ep, "upstream mapping missing")
    ids = {d["delivery_id"] for d in [*broken, dead]}

    small = replace(settings, console_bulk_confirm_above=2)
    with console_server(small) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        path = f"/api/v1/endpoints/{ep}/rerender"
        # the config still has the unknown macro: every one still fails to render
        pv = sup.get(path).json()
        assert (pv["replayable"], pv["renders"], pv["still_failing"]) == (4, 0, 4), pv
        assert pv["skipped"] == {"suppressed": 1}
        assert {x["delivery_id"] for x in pv["deliveries"]} == ids
        assert all("no_such_macro" in x["error"] for x in pv["deliveries"])
        # a publisher may not, a plain replay still refuses the suppressed ones
        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", (app,)))
        assert pub.get(path).status == 403 and pub.post(path, body={}).status == 403
        r = sup.post(f"/api/v1/deliveries/{broken[0]['delivery_id']}/replay", body={})
        assert r.status == 409 and "1 suppressed" in r.json()["error"], r.text

        # fix the template once
        _endpoint(settings, ep, app, f"{base}?c={{conversion_id}}&p={{payout_usd}}")
        pv = sup.get(path).json()
        assert (pv["replayable"], pv["renders"], pv["still_failing"]) == (4, 4, 0), pv
        first = {x["delivery_id"]: x for x in pv["deliveries"]}
        d0 = broken[0]
        req = first[d0["delivery_id"]]["request"]
        assert req["method"] == "GET"
        assert req["url"].startswith(f"{base}?c={d0['conversion']['conversion_id']}&p=1.25")
        assert "webhook-signature" in req["header_names"]
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        html = page.get(f"/endpoints/{ep}/rerender").text
        assert 'name="confirm" value="4"' in html and "no_such_macro" not in html
        assert f'href="/endpoints/{ep}/rerender"' in page.get(f"/endpoints/{ep}").text

        # the replay: the bulk rules (confirmation of the previewed count), then queued
        r = sup.post(path, body={})
        assert r.status == 409 and r.json()["needs_confirmation"] == 4, r.text
        r = sup.post(path, body={"confirm": 4, "note": "macro fixed"})
        assert r.status == 202, r.text
        job = r.json()["job_id"]
        assert r.json()["total"] == 4 and r.json()["skipped"] == {"suppressed": 1}
        assert sup.get(f"/api/v1/replays/{job}").json()["kind"] == "rerender"
        # nothing left to re-render while it is queued: the suppressions are resolved
        sups = {x["delivery_id"]: x for x in sup.get("/api/v1/suppressions").json()[
            "suppressions"] if x["endpoint_id"] == ep}
        assert all(sups[d["delivery_id"]]["resolved_by"] == f"support:sup-{ns}"
                   for d in broken)
        assert sups[poison["delivery_id"]]["resolved_at_ms"] is None
        # queued and not yet published: a second re-render leaves them out
        assert sup.get(path).json()["replayable"] == 0
        assert sup.post(path, body={"confirm": 4}).status == 404
    assert (f"support:sup-{ns}", "suppression.resolve") in _audit(settings, d0["delivery_id"])
    assert (f"support:sup-{ns}", "delivery.rerender") in _audit(settings, d0["delivery_id"])
    assert (f"support:sup-{ns}", "replay.rerender") in _audit(settings, job)

    before_ms = int(time.time() * 1000)
    assert _drain(settings) == 4
    sent = [decode("Delivery", m) for m in read_topic(settings, RETRY_5S, 4)]
    assert {d["delivery_id"] for d in sent} == ids
    # due once the agents have read the fixed config: two refreshes after publishing
    settle_ms = int(2000 * settings.config_refresh_s)
    assert all(d["due_at"] >= before_ms + settle_ms for d in sent), settle_ms
    by_id = {d["delivery_id"]: d for d in sent}
    assert by_id[d0["delivery_id"]]["idempotency_key"] == d0["idempotency_key"]
    assert {(d["trigger"], d["triggered_by"], d["override"]) for d in sent} == {
        ("manual", f"support:sup-{ns}", None)}


def test_resolve_a_suppression(settings: Settings, namespace: str) -> None:
    ns = namespace
    ep, app = f"ep_{ns}_sr", f"app_{ns}_sr"
    _endpoint(settings, ep, app, "https://pub.example/cb?c={conversion_id}")
    d = held_delivery(ns, 1, endpoint=ep, app=app)
    insert_deliveries(settings, [d], status="dead_lettered")
    did = d["delivery_id"]
    with console_server(settings) as port:
        sup = Client(port, bearer=token(settings, f"sup-{ns}", "support"))
        r = sup.post(f"/api/v1/suppressions/{did}/resolve", body={})
        assert r.status == 404, r.text  # not suppressed
        assert sup.post(f"/api/v1/deliveries/{did}/suppress",
                        body={"reason": "no upstream mapping"}).status == 200
        assert sup.post(f"/api/v1/deliveries/{did}/replay", body={}).status == 409
        pub = Client(port, bearer=token(settings, f"pub-{ns}", "publisher", (app,)))
        assert pub.post(f"/api/v1/suppressions/{did}/resolve", body={}).status == 403
        r = sup.post(f"/api/v1/suppressions/{did}/resolve", body={"note": "mapping added"})
        assert r.status == 200, r.text
        r = sup.post(f"/api/v1/suppressions/{did}/resolve", body={})
        assert r.status == 409 and "already resolved" in r.json()["error"]
        detail: dict[str, Any] = sup.get(f"/api/v1/deliveries/{did}").json()
        assert detail["suppression"]["resolved_by"] == f"support:sup-{ns}"
        # resolved: it may be replayed again, and suppressed again
        assert sup.post(f"/api/v1/deliveries/{did}/replay", body={}).status == 202
        page = Client(port)
        page.sign_in(token(settings, f"sup2-{ns}", "support"))
        html = page.get("/suppressions").text
        assert did in html and f"by support:sup-{ns}" in html
    assert [a for a in _audit(settings, did) if a[1] == "suppression.resolve"] == [
        (f"support:sup-{ns}", "suppression.resolve")]


def test_cli_rerender_previews_then_replays(settings: Settings, namespace: str,
                                            monkeypatch: Any, capsys: Any) -> None:
    from tests.integration.anomaly_helpers import run_cli

    ns = namespace
    ep, app = f"ep_{ns}_cli", f"app_{ns}_cli"
    _endpoint(settings, ep, app, "https://pub.example/cb?c={conversion_id}")
    with connect(settings.database_url) as conn:
        add_secret(conn, SecretBox(settings.secrets_key.reveal()), ep, generate_secret(),
                   now_ms=int(time.time() * 1000))
        conn.commit()
    broken = [held_delivery(ns, 30 + i, endpoint=ep, app=app) for i in range(2)]
    insert_deliveries(settings, broken, status="suppressed")
    _suppress(settings, [d["delivery_id"] for d in broken], ep, "render_failed: bad macro")
    assert run_cli(monkeypatch, settings, "deliveries", "rerender", "--endpoint", ep,
                   "--actor", f"ops-{ns}") == 0
    out = capsys.readouterr()
    assert "2 to re-render: 2 render now, 0 still fail" in out.err and "--yes" in out.err
    assert all(f"{d['delivery_id']}\tsuppressed\tGET https://pub.example/cb?c=" in out.out
               for d in broken)
    with connect(settings.database_url) as conn:  # a preview changes nothing
        assert conn.execute("SELECT count(*) FROM replay_items WHERE endpoint_id = %s",
                            (ep,)).fetchone() == (0,)
    assert run_cli(monkeypatch, settings, "deliveries", "rerender", "--endpoint", ep,
                   "--actor", f"ops-{ns}", "--yes") == 0
    assert "2/2 published\tdone" in capsys.readouterr().out
    sent = {decode("Delivery", m)["delivery_id"] for m in read_topic(settings, RETRY_5S, 2)}
    assert sent == {d["delivery_id"] for d in broken}


def test_previews_take_turns_and_leave_the_console_its_connections(
        settings: Settings, namespace: str, monkeypatch: Any) -> None:
    """A preview renders every undelivered delivery of its endpoint (up to the bulk cap):
    seconds for tens of thousands. Eight at once from one support user held every pooled
    connection while they rendered, and the rest of the console waited behind them. Now a
    person has one preview running at a time (429 for a second), a console renders a few
    at once, and none holds a connection while it renders. Each preview is held open
    here (the renderer waits for the test) to make the overlap certain."""
    import threading

    import replay_console.rerender as rr

    ns = namespace
    ep, app = f"ep_{ns}_pv", f"app_{ns}_pv"
    _endpoint(settings, ep, app, "https://pub.example/cb?c={conversion_id}")
    insert_deliveries(settings, [held_delivery(ns, i, endpoint=ep, app=app) for i in range(3)],
                      status="dead_lettered")
    real = rr.judge_rows
    entered = threading.Semaphore(0)
    release = threading.Event()

    def held_open(*args: Any) -> Any:
        entered.release()
        assert release.wait(30), "never released"
        return real(*args)

    monkeypatch.setattr(rr, "judge_rows", held_open)
    path = f"/api/v1/endpoints/{ep}/rerender"
    with console_server(settings) as port:
        people = [Client(port, bearer=token(settings, f"sup{i}-{ns}", "support"))
                  for i in range(6)]
        got: dict[int, int] = {}

        def preview(i: int) -> None:
            got[i] = people[i].get(path).status

        threads = [threading.Thread(target=preview, args=(i,)) for i in range(6)]
        threads[0].start()  # the first person's preview is rendering ...
        assert entered.acquire(timeout=20), "no preview started rendering"
        for t in threads[1:]:
            t.start()
        # ... one more renders at once; four wait their turn, off the pool
        assert entered.acquire(timeout=20), "a second preview did not start rendering"
        assert not entered.acquire(timeout=0.5), "a third preview rendered at once"
        # the same person again: refused until the first is done
        again = people[0].get(path)
        assert again.status == 429 and again.headers.get("retry-after") == "2", again.text
        # four waiting and two rendering, and every other page still has a connection
        for _ in range(8):
            assert people[5].get("/api/v1/deliveries?limit=1").status == 200
        release.set()
        for t in threads:
            t.join(30)
        assert got == dict.fromkeys(range(6), 200), got
        pv = people[0].get(path).json()
        assert pv["replayable"] == 3, pv
