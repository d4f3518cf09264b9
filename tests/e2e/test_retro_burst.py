"""The retrodated burst through the real gate, Kafka and PostgreSQL.

Under the global retrodating row's ``enforce`` (``burst_count`` 30 here), a few
retrodated deliveries are each held by the guard and halt nothing; a burst of them within
minutes halts the global scope: from then on every delivery is held (``halted_global``),
retrodated or not, until a person closes the halt. The close judges from itself on: the
burst that tripped it does not trip it again. No history is needed: the floor is absolute.
"""

from __future__ import annotations

import time

from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.gate_util import GateFeed
from tests.integration.anomaly_helpers import run_cli

MIN = 60_000
DAY = 1440 * MIN
PAY = 2_000_000


def _retro_row(settings: Settings) -> tuple[str, str | None]:
    with connect(settings.database_url) as conn:
        row = conn.execute("SELECT state, state_reason FROM payout_anomaly_settings WHERE"
                           " scope = 'global' AND scope_key = %s AND detector = 'retrodating'",
                           (settings.anomaly_global_key,)).fetchone()
    assert row is not None
    return row[0], row[1]


def test_a_burst_of_retrodated_deliveries_halts_the_global_scope(
        settings: Settings, stack: Stack, namespace: str, monkeypatch: object) -> None:
    with connect(settings.database_url) as conn:
        set_mode(conn, scope="global", scope_key=settings.anomaly_global_key,
                 detector="retrodating", mode="enforce", params={"burst_count": 30},
                 actor="test", note="e2e: the retrodated burst")
        conn.commit()
    eps = [f"ep_{namespace}_{i}" for i in range(4)]
    feed = GateFeed(settings)
    stack.start("gate", "gate")
    wait_for(lambda: "gate running" in stack.procs["gate"].tail(400), 60, what="the gate")
    now = int(time.time() * 1000)
    t0 = now - now % MIN - 30 * MIN
    sent = 0

    def minute(m: int, normal: int, retro: int) -> str:
        nonlocal sent
        at = t0 + m * MIN
        for i in range(normal):
            feed.send(eps[i % 4], at + i * 1000, PAY)
        for i in range(retro):
            feed.send(eps[i % 4], at + 500 + i * 1000, PAY, source_completed_at=at - 8 * DAY,
                      source_created_at=at)
        sent += normal + retro
        feed.wait_outputs(sent)
        deadline = time.monotonic() + 3.0  # partials -> aggregator -> PostgreSQL
        while time.monotonic() < deadline and _retro_row(settings)[0] != "tripped":
            time.sleep(0.1)
        return _retro_row(settings)[0]

    # Ten minutes with one retrodated delivery each: each held, nothing halted.
    for m in range(10):
        assert minute(m, normal=8, retro=1) == "closed", m
    held = feed.held()
    assert [d["hold_reason"] for d in held] == ["retrodated"] * 10
    assert feed.dispatched_count() == 80

    # Twelve a minute: the 15-minute span passes 30 in the second minute.
    tripped = next((m for m in range(10, 14) if minute(m, normal=8, retro=12) == "tripped"),
                   None)
    _state, reason = _retro_row(settings)
    assert tripped == 11, (tripped, reason)
    assert reason is not None and "retrodated burst:" in reason, reason
    assert "-min span (retrodated burst): 34 retrodated deliveries" in reason, reason
    log = stack.procs["gate"].tail(2000)
    assert "retrodated burst over its threshold" in log and "ERROR" not in log, log[-2000:]

    # Halted: a delivery that is not retrodated is held too.
    before = len(feed.held())
    did = feed.send(eps[0], t0 + 12 * MIN, PAY)
    feed.wait_held(before + 1)
    assert [d["hold_reason"] for d in feed.held() if d["delivery_id"] == did] == [
        "halted_global"]

    # A person closes it; the burst's minutes do not trip it again.
    code = run_cli(monkeypatch, settings, "anomaly", "close", "--scope", "global",  # type: ignore[arg-type]
                   "--detector", "retrodating", "--actor", "alice", "--note", "upstream fixed")
    assert code == 0
    wait_for(lambda: "retrodating is now closed" in stack.procs["gate"].tail(400), 30,
             what="the gate reading the close")
    sent += 1
    dispatched = feed.dispatched_count()
    for m in range(13, 16):
        assert minute(m, normal=8, retro=0) == "closed", m
    assert feed.dispatched_count() == dispatched + 24  # nothing halted any more
    assert "global halt closed: the rolling spans judge from" in stack.procs["gate"].tail(400)
