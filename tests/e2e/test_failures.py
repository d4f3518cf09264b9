"""Nothing lost through kill -9 of the relay, a broker restart and a PostgreSQL outage."""

from __future__ import annotations

import subprocess
import threading

import psycopg
import pytest

from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.conftest import ROOT
from tests.e2e.harness import Harness

SERVICES = ["bash", str(ROOT / "deploy" / "local" / "services.sh")]


@pytest.fixture()
def h(settings: Settings, stack: Stack, namespace: str) -> Harness:
    harness = Harness(settings, stack, namespace)
    harness.start_receiver()
    return harness


def _services(*args: str) -> None:
    r = subprocess.run([*SERVICES, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (
        f"services.sh {' '.join(args)} failed (these tests restart the services that "
        f"deploy/local/services.sh started):\n{r.stdout}\n{r.stderr}")


def _pg_up(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=1).close()
        return True
    except psycopg.OperationalError:
        return False


def _all_delivered(h: Harness, endpoints: list[str], per_endpoint: int, timeout: float) -> None:
    for ep in endpoints:
        h.wait_status(ep, "delivered", per_endpoint, timeout=timeout)
    stats = h.stats()
    assert stats["bad_signatures"] == 0
    for ep in endpoints:
        got = h.received(ep)
        ids = {r["webhook_id"] for r in got if r["status"] == 200}
        assert len(ids) == per_endpoint, f"{ep}: {len(ids)} distinct delivered ids"


def test_kill_9_of_the_relay_under_load(h: Harness) -> None:
    eps = [h.endpoint(f"r{i}") for i in range(4)]
    for ep in eps:
        h.script(ep, statuses=[503, 200], per_delivery=True)  # every one via retry.5s + relay
    # (a breaker would open on this many 503s: lift its threshold for this test)
    h.start_stages({"POSTBACKS_RETRY_BASE_S": "1", "POSTBACKS_BREAKER_FAILURE_THRESHOLD": "5000"})
    for i in range(4):
        h.emit(f"r{i}", 300)
    wait_for(lambda: sum(1 for r in h.received() if r["status"] == 200) >= 150, 120,
             interval=0.05, what="the relay to have re-driven some deliveries")
    h.stack.procs["relay"].kill9()
    h.stack.start("relay-restarted", "relay")
    _all_delivered(h, eps, 300, timeout=180)
    assert h.scalar("SELECT count(*) FROM delivery_attempts WHERE endpoint_id = ANY(%s)"
                    " AND result = 'retryable'", (eps,)) == 1200


def test_broker_restart_mid_run(h: Harness) -> None:
    eps = [h.endpoint(f"b{i}") for i in range(4)]
    for ep in eps:
        h.script(ep, statuses=[200], delay_ms=2)
    h.start_stages()
    for i in range(4):
        h.emit(f"b{i}", 500)
    wait_for(lambda: len(h.received()) >= 300, 120, interval=0.05, what="300 received")
    _services("restart-kafka", "3")
    _all_delivered(h, eps, 500, timeout=300)
    assert not h.stack.dead(), f"stages died across the broker restart: {h.stack.dead()}"


def test_postgres_outage_the_sink_waits_and_catches_up(h: Harness) -> None:
    eps = [h.endpoint(f"p{i}") for i in range(2)]
    h.start_stages({"POSTBACKS_CONFIG_REFRESH_S": "1"})
    h.emit("p0", 200)
    h.wait_status(eps[0], "delivered", 200)
    # p1 is emitted and delivered while PostgreSQL is away, so the sink must wait for it,
    # then catch up (traffic emitted before the restart could be done and stored before
    # the restart began: with records taken as they arrive, 200 take ~1 s)
    outage = threading.Thread(target=_services, args=("restart-postgres", "8"))
    outage.start()
    try:
        wait_for(lambda: not _pg_up(h.settings.database_url), 30, interval=0.05,
                 what="PostgreSQL down")
        h.emit("p1", 200)
        wait_for(lambda: len(h.received(eps[1])) >= 200, 60, interval=0.05,
                 what="p1 delivered while PostgreSQL is down")
    finally:
        outage.join()
    _all_delivered(h, eps, 200, timeout=180)
    assert "PostgreSQL" in h.stack.procs["sink"].tail(400)  # it noticed, waited and resumed
    assert not h.stack.dead(), f"stages died across the outage: {h.stack.dead()}"
