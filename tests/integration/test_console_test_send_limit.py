"""Test-sends are limited per endpoint and per user: the console, or a token taken from a
support person, is not a way to flood a publisher's endpoint with signed requests. Past
either limit the console answers 429 with ``Retry-After``, audits the refusal and sends
nothing; other endpoints and other users keep their own counts."""

from __future__ import annotations

import dataclasses
from typing import Any

from postbacks.core.endpoint import EndpointConfig
from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from postbacks.tools.procs import free_port, http_json, wait_for
from tests.integration.console_util import Client, console_server, token


def test_test_sends_past_the_limits_are_refused_unsent_and_audited(
        settings: Settings, namespace: str, stack: Any) -> None:
    ns = namespace
    eps = [f"ep_{ns}_a", f"ep_{ns}_b"]
    with connect(settings.database_url) as conn:
        for ep in eps:
            upsert_endpoint(conn, endpoint_id=ep, app_id=f"app_{ns}",
                            url=f"https://pub.example/{ep}", config=EndpointConfig())
        conn.commit()
    rport = free_port()
    stack.start("receiver", "receiver", "--port", str(rport))
    rbase = f"http://127.0.0.1:{rport}"
    wait_for(lambda: http_json(f"{rbase}/_control/stats"), 30, what="receiver")
    limited = dataclasses.replace(settings, console_test_sends_per_endpoint=3,
                                  console_test_sends_per_user=5)

    def received(ep: str) -> int:
        return len(http_json(f"{rbase}/_control/received?endpoint={ep}"))

    with console_server(limited) as port:
        alice = Client(port, bearer=token(settings, f"alice-{ns}", "admin"))
        bob = Client(port, bearer=token(settings, f"bob-{ns}", "admin"))
        for ep in eps:
            r = alice.post(f"/api/v1/endpoints/{ep}/secrets", body={"secret": generate_secret()})
            assert r.status == 200, r.text

        def send(who: Client, ep: str) -> Any:
            return who.post(f"/api/v1/endpoints/{ep}/test-send",
                            body={"override": {"url": f"{rbase}/hooks/{ep}"}})

        for _ in range(3):
            r = send(alice, eps[0])
            assert r.status == 200 and r.json()["ok"], r.text
        r = send(alice, eps[0])  # the endpoint's fourth within the minute
        assert r.status == 429, r.text
        assert "too many test-sends to this endpoint" in r.json()["error"]
        assert 1 <= int(r.headers["retry-after"]) <= 60
        r = send(bob, eps[0])  # the endpoint's count, whoever sends
        assert r.status == 429 and "this endpoint" in r.json()["error"]
        assert received(eps[0]) == 3

        for _ in range(2):  # alice's fourth and fifth: her limit is 5
            assert send(alice, eps[1]).status == 200
        r = send(alice, eps[1])
        assert r.status == 429 and "too many test-sends by you" in r.json()["error"], r.text
        assert send(bob, eps[1]).status == 200  # bob's own count; the endpoint's third
        assert send(bob, eps[1]).status == 429
        assert received(eps[1]) == 3
        # a refused test-send never reached the receiver, and an unknown endpoint counts
        # nothing (it is a 404 before the limit)
        assert alice.post(f"/api/v1/endpoints/ep_{ns}_none/test-send", body={}).status == 404

    with connect(settings.database_url) as conn:
        rows = conn.execute(
            "SELECT actor, action, count(*) FROM audit_log WHERE actor = ANY(%s)"
            " GROUP BY 1, 2", ([f"admin:alice-{ns}", f"admin:bob-{ns}"],)).fetchall()
    got = {(a, x): n for a, x, n in rows}
    assert got[(f"admin:alice-{ns}", "endpoint.test_send")] == 5
    assert got[(f"admin:bob-{ns}", "endpoint.test_send")] == 1
    # refusals: at most one audit row per actor, action and minute
    assert got.get((f"admin:alice-{ns}", "refused.test_send"), 0) >= 1
    assert got.get((f"admin:bob-{ns}", "refused.test_send"), 0) >= 1
