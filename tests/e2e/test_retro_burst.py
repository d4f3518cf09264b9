"""The retrodated burst through the real gate, Kafka and PostgreSQL.

Under the global retrodating row's ``enforce`` (``burst_count`` 30 here), a few
retrodated deliveries are each held by the guard and halt nothing; a burst of them within
minutes halts the global scope: from then on every delivery is held (``halted_global``),
retrodated or not, until a person closes the halt. The close judges from itself on: the
burst that tripped it does not trip it again. No history is needed: the floor is absolute.
"""

from __future__ import annotations

import re
import time

from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.gate_util import GateFeed, endpoint_on
from tests.integration.anomaly_helpers import run_cli
from topics import TOPICS

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
    # One endpoint per partition, each sent to every minute, so every partition moves on
    # and the roll-up closes each minute as the next one begins.
    parts = TOPICS.deliveries.partitions
    eps = [endpoint_on(p, f"ep_{namespace}_{p}") for p in range(parts)]
    feed = GateFeed(settings)
    stack.start("gate", "gate")
    wait_for(lambda: "gate running" in stack.procs["gate"].tail(400), 60, what="the gate")
    now = int(time.time() * 1000)
    t0 = now - now % MIN - 30 * MIN
    sent = 0

    def gauge(pattern: str) -> float | None:
        page = stack.procs["gate"].metrics() or ""
        got = re.search(pattern + r" (\S+)$", page, re.M)
        return None if got is None else float(got.group(1))

    def observed() -> float | None:
        return gauge(r'^postbacks_anomaly_retro_burst\{quantity="observed"\}')

    def watermark_ms() -> float:
        return 1000 * (gauge(r"^postbacks_anomaly_global_watermark_seconds") or 0)

    def minute(m: int, normal: int, retro: int, in_span: int) -> str:
        """Send minute ``m``; once the aggregator has counted it (its span holds
        ``in_span`` retrodated deliveries), the global retrodating row's state. At 30 or
        more it must trip: the state once the trip is in PostgreSQL."""
        nonlocal sent
        at = t0 + m * MIN
        for i in range(normal):
            feed.send(eps[i % parts], at + i * 1000, PAY, partition=i % parts)
        for i in range(retro):
            feed.send(eps[i % parts], at + 500 + i * 1000, PAY, partition=i % parts,
                      source_completed_at=at - 8 * DAY, source_created_at=at)
        sent += normal + retro
        feed.wait_outputs(sent)
        if m:  # the minutes before closed: every partition heard, or its grace over
            wait_for(lambda: watermark_ms() >= at, 30, what=f"minute {m} open in the roll-up",
                     progress=watermark_ms)
        wait_for(lambda: observed() == in_span, 30, what=f"{in_span} in the burst's span",
                 progress=observed)
        if in_span >= 30:
            wait_for(lambda: _retro_row(settings)[0] == "tripped", 30, what="the trip")
        return _retro_row(settings)[0]

    # Ten minutes with one retrodated delivery each: each held, nothing halted.
    for m in range(10):
        assert minute(m, normal=8, retro=1, in_span=m + 1) == "closed", m
    held = feed.held()
    assert [d["hold_reason"] for d in held] == ["retrodated"] * 10
    assert feed.dispatched_count() == 80

    # Twelve a minute: the 15-minute span passes 30 in the second minute.
    assert minute(10, normal=8, retro=12, in_span=22) == "closed"
    assert minute(11, normal=8, retro=12, in_span=34) == "tripped"
    _state, reason = _retro_row(settings)
    assert reason is not None and "retrodated burst:" in reason, reason
    # It trips on the first partial batch that reaches 30: between 30 and all 34 of them.
    got = re.search(r"-min span \(retrodated burst\): (\d+) retrodated deliveries", reason)
    assert got is not None and 30 <= int(got.group(1)) <= 34, reason
    log = stack.procs["gate"].tail(2000)
    assert "retrodated burst over its threshold" in log and "ERROR" not in log, log[-2000:]

    # Halted: a delivery that is not retrodated is held too.
    before = len(feed.held())
    did = feed.send(eps[0], t0 + 12 * MIN, PAY, partition=0)
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
    for m in range(13, 16):  # the span judges from the close on: nothing in it
        assert minute(m, normal=8, retro=0, in_span=0) == "closed", m
    assert feed.dispatched_count() == dispatched + 24  # nothing halted any more
    assert "global halt closed: the rolling spans judge from" in stack.procs["gate"].tail(400)
