"""An endpoint's hours closed while it (or the global scope) is halted do not enter its
hour-of-week profile: a held incident does not raise the expectation of its hours in
later weeks. Hours are learnt again once the halt is closed."""

from __future__ import annotations

from typing import Any

from postbacks.core.anomaly import GLOBAL_SCOPE, HaltState
from postbacks.core.anomaly.halts import StateChange
from tests.unit.test_payout_outlier import HOUR, USD, W0, WEEK_MS, _gate, _history, _rec, _run


def _profile_after_three_hours(scope: tuple[str, str] | None) -> tuple[Any, Any, Any]:
    g, store = _gate("enforce"), {}
    n = _history(g, store)
    if scope is not None:
        g.halts.apply(StateChange(scope, "value_rate", HaltState.TRIPPED, 1))
    before = g.scopes["ep_1"].state.profile
    at = W0 + 3 * WEEK_MS + HOUR
    _run(g, store, [_rec(n + i, at + i * 60_000, 30 * USD) for i in range(3 * 60)])
    during = g.scopes["ep_1"].state.profile
    if scope is not None:
        g.halts.apply(StateChange(scope, "value_rate", HaltState.CLOSED, 2))
    _run(g, store, [_rec(n + 1000 + i, at + 4 * HOUR + i * 60_000, 30 * USD)
                    for i in range(2 * 60)])
    return before, during, g.scopes["ep_1"].state.profile


def test_an_endpoint_halt_keeps_its_hours_out_of_the_profile() -> None:
    before, during, after = _profile_after_three_hours(("endpoint", "ep_1"))
    assert during == before
    assert after != before  # learning again after the close


def test_a_global_halt_keeps_every_endpoints_hours_out_of_its_profile() -> None:
    before, during, _after = _profile_after_three_hours(GLOBAL_SCOPE)
    assert during == before


def test_without_a_halt_the_hours_are_learnt() -> None:
    before, during, _after = _profile_after_three_hours(None)
    assert during != before
