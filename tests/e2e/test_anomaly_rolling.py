"""The global rolling detector through the real gate, Kafka and PostgreSQL.

Two weeks and two hours of steady history ($2 every 10 s of event time, spread over four
endpoints: $12 and 6 conversions a minute globally) go through the gate as a backlog; then
event time is fed one minute at a time, waiting for the gate's outputs and the aggregator
after each, so the minute the global scope trips is known exactly. A surge of +138 %
(14.3 conversions a minute) starting at minute 50 of an hour trips the global scope within
minutes, from the 5-minute span; an hourly rule (the whole hour's running total against
1.25 x the median of its hour of the week, no floor) would not have tripped in that hour. Normal
history and normal minutes trip nothing.

With two gate instances, killing (-9) the one that runs the global roll-up in the middle of
the surge moves the roll-up to the other with its state (the ``gate-global`` changelog and
the per-partition partials), and the global scope still trips within minutes of event time.

With the spans out of reach (the row's ``k`` at 50) and 60 hours of profiled history (so
today's level is learned), the CUSUM arm on the count trips the same surge on its own.

Closed through ``postbacks anomaly close`` while the surge still fills every span, the
scope trips nothing on the normal minutes after the close (the spans judge from the close
on), and a new surge after them trips again.
"""

from __future__ import annotations

import re
import statistics
import time

import pytest

from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, wait_for
from tests.e2e.gate_util import GateFeed
from tests.integration.anomaly_helpers import run_cli

MIN = 60_000
HOUR = 60 * MIN
WEEK = 168 * HOUR
PAY = 2_000_000
SURGE_STEP_MS = 4_200  # +138 %: 14.3 conversions a minute instead of 6


def _global(settings: Settings) -> tuple[str, str | None] | None:
    with connect(settings.database_url) as conn:
        row = conn.execute("SELECT state, state_reason FROM payout_anomaly_settings WHERE"
                           " scope = 'global' AND scope_key = %s AND detector = 'value_rate'",
                           (settings.anomaly_global_key,)).fetchone()
    return None if row is None else (row[0], row[1])


def _tripped(settings: Settings) -> bool:
    state = _global(settings)
    return state is not None and state[0] == "tripped"


class Run:
    """The history fed as a backlog, then the surge one minute at a time."""

    def __init__(self, settings: Settings, namespace: str, profiled_hours: int = 2,
                 params: dict[str, float] | None = None) -> None:
        """``profiled_hours``: history after the profile's first 2 weeks (today's level,
        which the CUSUM arm waits for, is learned after about 48 of them)."""
        self.settings = settings
        with connect(settings.database_url) as conn:
            set_mode(conn, scope="global", scope_key=settings.anomaly_global_key,
                     detector="value_rate", mode="enforce", params=params,
                     actor="test")  # defaults unless params
            conn.commit()
        self.eps = [f"ep_{namespace}_{i}" for i in range(4)]
        self.feed = GateFeed(settings)
        t0 = self.feed.hour_ago(weeks=3) - profiled_hours * HOUR
        self.events: list[tuple[int, int]] = []  # (occurred_at, payout)
        self.n = 0
        self.surge_hour = t0 + 2 * WEEK + profiled_hours * HOUR
        for at in range(t0, self.surge_hour + 50 * MIN, 10_000):
            self.send(at)
        self.feed.flush()

    def send(self, at: int) -> None:
        self.feed.send(self.eps[self.n % len(self.eps)], at, PAY)
        self.events.append((at, PAY))
        self.n += 1

    def history_through(self) -> None:
        self.feed.wait_outputs(self.n, timeout=300)
        self.feed.wait_partials_applied()
        assert self.feed.held() == [], "normal history held something"
        before_surge = _global(self.settings)
        assert before_surge is not None and before_surge[0] == "closed", before_surge

    def minute(self, minute: int, timeout: float = 60, surge_from: int = 50,
               normal: bool = False) -> bool:
        """Send the events of ``minute`` (from the surge hour's start): the surge that began
        at minute ``surge_from``, or normal traffic; whether the scope is tripped after."""
        start = self.surge_hour + minute * MIN
        first, step = (start, 10_000) if normal else (self.surge_hour + surge_from * MIN,
                                                      SURGE_STEP_MS)
        for at in range(first, start + MIN, step):
            if at >= start:
                self.send(at)
        self.feed.wait_outputs(self.n, timeout=timeout)
        deadline = time.monotonic() + 3.0  # partials -> aggregator -> PostgreSQL
        while time.monotonic() < deadline and not _tripped(self.settings):
            time.sleep(0.1)
        return _tripped(self.settings)

    def span_start(self, state: tuple[str, str | None] | None) -> int:
        assert state is not None and state[1] is not None
        m = re.search(r"in window (\d+)", state[1])
        assert m is not None, state
        return int(m.group(1))


def _aggregator(stack: Stack, names: tuple[str, ...]) -> str | None:
    """The gate instance whose postbacks_gate_aggregator is 1 (None unless exactly one)."""
    owners = []
    for name in names:
        try:
            page = stack.procs[name].metrics() or ""
        except OSError:
            continue
        if re.search(r"^postbacks_gate_aggregator 1\.0$", page, re.M):
            owners.append(name)
    return owners[0] if len(owners) == 1 else None


def test_a_surge_at_minute_50_trips_the_global_scope_within_minutes(
        settings: Settings, stack: Stack, namespace: str) -> None:
    run = Run(settings, namespace)
    stack.start("gate", "gate")
    wait_for(lambda: "gate running" in stack.procs["gate"].tail(400), 60, what="the gate")
    run.history_through()

    tripped_at = next((m for m in range(50, 70) if run.minute(m)), None)
    state = _global(settings)
    print(f"\nglobal trip after minute {tripped_at} of the hour (surge from minute 50);"
          f" reason: {state}")
    assert tripped_at is not None, "the global scope never tripped"
    assert 52 <= tripped_at <= 56
    # the span that tripped starts at most 5 minutes before the surge, inside the hour
    assert run.surge_hour + 45 * MIN <= run.span_start(state) <= run.surge_hour + 56 * MIN
    assert state is not None and re.search(r"\(\d+-min span", state[1] or ""), state
    log = stack.procs["gate"].tail(2000)
    assert re.search(r"global rolling detector over its thresholds: \d+-min span", log), \
        log[-2000:]

    # After the trip, everything is held as halted_global.
    before = len(run.feed.held())
    run.send(run.surge_hour + (tripped_at + 1) * MIN)
    run.feed.wait_held(before + 1)
    assert run.feed.held()[-1]["hold_reason"] == "halted_global"

    # An hourly rule on the same events -- the open hour's running total against 1.25 x the
    # median of the same hour of the previous weeks, the surge kept up to the end of its
    # hour -- would not have tripped anywhere in that hour.
    hour = run.surge_hour
    surge = [(at, PAY) for at in range(hour + 50 * MIN, hour + HOUR, SURGE_STEP_MS)]
    events = sorted({*(e for e in run.events if e[0] < hour + 50 * MIN), *surge})
    past = [t for w in (1, 2, 3, 4) if (t := sum(
        p for at, p in events if hour - w * WEEK <= at < hour - w * WEEK + HOUR))]
    assert len(past) >= 2
    running = 0
    over_in_hour = False
    for at, pay in events:
        if hour <= at < hour + HOUR:
            running += pay
            over_in_hour = over_in_hour or running > 1.25 * statistics.median(past)
    assert not over_in_hour


def test_the_aggregator_killed_mid_surge_and_the_global_scope_still_trips(
        settings: Settings, stack: Stack, namespace: str) -> None:
    run = Run(settings, namespace)
    gates = ("gate", "gate-2")
    for name in gates:  # the second joins while the first reads the backlog: a rebalance
        stack.start(name, "gate", extra_env={"POSTBACKS_INSTANCE_ID": f"{namespace}-{name}"})
        wait_for(lambda n=name: "gate running" in stack.procs[n].tail(400), 60,
                 what=f"{name} running")
    run.history_through()
    owner = wait_for(lambda: _aggregator(stack, gates), 30, what="one aggregator")
    assert run.minute(50) is False
    assert run.minute(51) is False
    stack.procs[owner].kill9()  # mid-surge: the roll-up must move with its state
    survivor = next(n for n in gates if n != owner)

    tripped_at = next((m for m in range(52, 70) if run.minute(m, timeout=120)), None)
    state = _global(settings)
    print(f"\n{owner} (the aggregator) killed after minute 51; global trip after minute"
          f" {tripped_at} in {survivor}; reason: {state}")
    assert tripped_at is not None, "the global scope never tripped after the failover"
    assert tripped_at <= 57
    assert run.surge_hour + 45 * MIN <= run.span_start(state) <= run.surge_hour + 57 * MIN
    log = stack.procs[survivor].tail(4000)
    assert "this instance runs the global roll-up" in log, log[-2000:]
    assert re.search(r"global rolling detector over its thresholds: \d+-min span", log), \
        log[-2000:]
    assert _aggregator(stack, (survivor,)) == survivor


def test_a_closed_halt_judges_anew_no_retrip_on_its_own_surge_but_on_a_new_one(
        settings: Settings, stack: Stack, namespace: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The halt is closed while the surge's minutes still fill the 5-, 15- and 60-minute
    spans: normal minutes after the close trip nothing (the spans judge from the close on),
    and a new surge after them trips again, from a span that starts after the close."""
    run = Run(settings, namespace)
    stack.start("gate", "gate")
    gate = stack.procs["gate"]
    wait_for(lambda: "gate running" in gate.tail(400), 60, what="the gate")
    run.history_through()
    tripped_at = next((m for m in range(50, 70) if run.minute(m)), None)
    assert tripped_at is not None, "the global scope never tripped"
    closed_after = tripped_at + 6  # the surge goes on, held: it fills the 15-min span
    for m in range(tripped_at + 1, closed_after + 1):
        run.minute(m)
    held = len(run.feed.held())
    assert held >= 6 * 14

    assert run_cli(monkeypatch, settings, "anomaly", "close", "--scope", "global",
                   "--detector", "value_rate", "--actor", "carol",
                   "--note", "the surge was a test") == 0
    wait_for(lambda: re.search(r"halt global/\S+ value_rate is now closed", gate.tail(400)),
             30, what="the gate reading the close")
    dispatched = run.feed.dispatched_count()
    normal = range(closed_after + 1, closed_after + 8)
    for m in normal:  # the 15-min span holds 11 surge minutes at the first of these
        assert run.minute(m, normal=True) is False, f"re-tripped after normal minute {m}"
    assert len(run.feed.held()) == held, "a normal minute after the close was held"
    assert run.feed.dispatched_count() == dispatched + 6 * len(normal)
    since = re.search(r"global halt closed: the rolling spans judge from event time (\d+)",
                      gate.tail(2000))
    assert since is not None, gate.tail(2000)[-2000:]
    # the minute after the newest the roll-up knew when it saw the close
    assert (run.surge_hour + (closed_after + 1) * MIN <= int(since.group(1))
            <= run.surge_hour + (closed_after + 2) * MIN), since.group(1)

    again = normal[-1] + 1
    tripped_again = next((m for m in range(again, again + 10)
                          if run.minute(m, surge_from=again)), None)
    state = _global(settings)
    print(f"\nclosed after minute {closed_after}; normal minutes {normal[0]}-{normal[-1]} "
          f"tripped nothing; a new surge from minute {again} tripped after minute "
          f"{tripped_again}: {state}")
    assert tripped_again is not None, "a surge after the close never tripped"
    assert tripped_again <= again + 5
    assert run.span_start(state) >= int(since.group(1))


def test_the_cusum_arm_trips_a_sustained_surge_on_its_own(
        settings: Settings, stack: Stack, namespace: str) -> None:
    run = Run(settings, namespace, profiled_hours=60, params={"k": 50.0})
    stack.start("gate", "gate")
    wait_for(lambda: "gate running" in stack.procs["gate"].tail(400), 60, what="the gate")
    run.history_through()  # 60 profiled hours, the arm stepping: nothing tripped or held
    tripped_at = next((m for m in range(50, 75) if run.minute(m)), None)
    state = _global(settings)
    print(f"\nspans at k 50; the CUSUM arm tripped after minute {tripped_at} (surge from "
          f"minute 50); reason: {state}")
    assert tripped_at is not None, "the CUSUM arm never tripped"
    # +138% at 6 a minute: about 2.7 a minute of log-likelihood ratio, h 12.5, and the
    # run over the $50 floor
    assert 52 <= tripped_at <= 58
    assert state is not None and "CUSUM count +50% arm" in (state[1] or ""), state
    assert run.span_start(state) >= run.surge_hour + 49 * MIN
    page = stack.procs["gate"].metrics() or ""
    got = re.search(r'^postbacks_anomaly_cusum\{arm="count \+50%",scope="global"\} (\S+)$',
                    page, re.M)
    assert got is not None and float(got.group(1)) > 12.5, page[-2000:]
    ticks = re.search(r'^postbacks_event_loop_lag_seconds_count\{process="gate"\} (\S+)$', page,
                      re.M)  # the gate's event loop is watched (postbacks/loopwatch.py)
    assert ticks is not None and float(ticks.group(1)) > 0, page[-2000:]
