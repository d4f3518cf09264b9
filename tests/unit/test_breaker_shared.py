"""The shared circuit breaker (core/breaker.py): transitions stamped, merged across agents,
carried by BreakerState records."""

from __future__ import annotations

import pytest

from postbacks.codec import codec_for
from postbacks.core.breaker import (
    BreakerPolicy,
    BreakerState,
    Divert,
    Send,
    admit,
    from_record,
    merge,
    not_ahead,
    on_result,
    to_record,
)

P = BreakerPolicy(failure_threshold=3, open_s=10, ramp_s=100, probe_timeout_s=30)
OPEN = BreakerState("open", 3, 1_000, changed_ms=1_000)


def _open_at(now: int) -> BreakerState:
    s = BreakerState()
    for _ in range(3):
        s = on_result(P, s, now, failed=True, probe=False)
    return s


def test_every_transition_is_stamped_with_its_time() -> None:
    s = _open_at(1_000)
    assert (s.state, s.changed_ms) == ("open", 1_000)
    _, s = admit(P, s, 11_000, 4)
    assert (s.state, s.changed_ms) == ("half_open", 11_000)
    s = on_result(P, s, 11_500, failed=False, probe=True)
    assert (s.state, s.changed_ms, s.ramp_started_ms) == ("ramping", 11_500, 11_500)
    _, s = admit(P, s, 500_000, 4)
    # the ramp's end, the same in every agent however late it looks
    assert (s.state, s.changed_ms) == ("closed", 11_500 + 100_000)
    failed_once = on_result(P, s, 600_000, failed=True, probe=False)
    assert failed_once.changed_ms == s.changed_ms  # a count is no transition


@pytest.mark.parametrize(
    ("local", "remote", "want_state", "want_changed"),
    [
        # a newer transition wins
        (BreakerState(), OPEN, "open", 1_000),
        (OPEN, BreakerState("ramping", 0, 1_000, 12_000, changed_ms=12_000), "ramping", 12_000),
        # an older one (or our own coming back) changes nothing
        (BreakerState("ramping", 0, 1_000, 12_000, changed_ms=12_000), OPEN, "ramping", 12_000),
        (OPEN, OPEN, "open", 1_000),
        # the same time: the stricter state
        (BreakerState("closed", 0, changed_ms=1_000), OPEN, "open", 1_000),
        (OPEN, BreakerState("closed", 0, changed_ms=1_000), "open", 1_000),
    ],
)
def test_merge_keeps_the_latest_transition(local: BreakerState, remote: BreakerState,
                                           want_state: str, want_changed: int) -> None:
    got = merge(P, local, remote)
    assert (got.state, got.changed_ms) == (want_state, want_changed)


def test_an_open_breaker_from_another_agent_diverts_here_until_its_period_ends() -> None:
    here = BreakerState()  # this agent saw nothing wrong (or just started)
    for _ in range(2):
        here = on_result(P, here, 900, failed=True, probe=False)
    s = merge(P, here, OPEN)
    assert s.consecutive_failures == 3 and s.opened_at_ms == 1_000
    assert admit(P, s, 5_000, 4)[0] == Divert("breaker_open", 11_000)
    decision, _ = admit(P, s, 11_000, 4)
    assert decision == Send(1, probe=True)


def test_another_agents_probe_holds_this_one_back_for_at_most_the_probe_timeout() -> None:
    theirs = BreakerState("half_open", 3, 1_000, changed_ms=11_000, probe_in_flight=True)
    s = merge(P, OPEN, theirs)
    decision, s = admit(P, s, 12_000, 4)
    assert decision == Divert("breaker_probing", 12_000 + 10_000)
    decision, s = admit(P, s, 11_000 + 30_000, 4)  # their probe's agent died, say
    assert decision == Send(1, probe=True) and s.probe_until_ms == 0
    assert s.changed_ms == 41_000  # our own probe is a transition of ours, published


def test_a_probe_result_after_another_agents_transition_does_not_override_it() -> None:
    _, mine = admit(P, OPEN, 11_000, 4)  # our probe is out
    theirs_open = BreakerState("open", 3, 11_200, changed_ms=11_200)  # theirs failed first
    s = merge(P, mine, theirs_open)
    s = on_result(P, s, 11_400, failed=False, probe=True)  # our probe succeeded later
    assert (s.state, s.changed_ms) == ("open", 11_200)


@pytest.mark.parametrize("state", [
    OPEN,
    BreakerState("ramping", 0, 1_000, 12_000, changed_ms=12_000),
    BreakerState("half_open", 3, 1_000, changed_ms=11_000, probe_in_flight=True),
    BreakerState("closed", 0, changed_ms=112_000),
])
def test_a_published_transition_reads_back_as_the_same_state(state: BreakerState) -> None:
    codec = codec_for("BreakerState")
    rec = codec.decode(codec.encode(to_record("ep_x", state, "agent-1/run_1")))
    assert rec["scope_key"] == "ep_x" and rec["actor"] == "agent-1/run_1"
    back = from_record(rec)  # type: ignore[arg-type]
    assert back is not None
    assert (back.state, back.consecutive_failures, back.opened_at_ms, back.ramp_started_ms,
            back.changed_ms) == (state.state, state.consecutive_failures, state.opened_at_ms,
                                 state.ramp_started_ms, state.changed_ms)


def test_an_anomaly_halt_is_no_circuit_breaker() -> None:
    rec = {"scope": "endpoint", "scope_key": "ep_x", "detector": "payout_rate",
           "state": "tripped", "changed_at": 1, "reason": None, "actor": None,
           "observed_value": None, "baseline_value": None}
    assert from_record(rec) is None  # type: ignore[arg-type]


def test_a_transition_from_an_agent_whose_clock_runs_ahead_is_taken_as_now() -> None:
    """An open published by an agent two hours ahead used to keep every other agent
    diverting the endpoint for two hours past its open period (and ignoring its own later
    transitions); taken as now, it lasts its period from now."""
    now, ahead = 1_000_000, 1_000_000 + 2 * 3600 * 1000
    skewed = BreakerState("open", 3, ahead, changed_ms=ahead)
    s = merge(P, BreakerState(), not_ahead(skewed, now))
    assert (s.state, s.opened_at_ms, s.changed_ms) == ("open", now, now)
    assert admit(P, s, now + 5_000, 4)[0] == Divert("breaker_open", now + 10_000)
    assert admit(P, s, now + 10_000, 4)[0] == Send(1, probe=True)  # its 10 s, from now
    honest = BreakerState("open", 3, now - 5, changed_ms=now - 5)
    assert not_ahead(honest, now) is honest
