"""The console's per-target and per-actor action limit (test-sends): counts within the
window, a refusal counts nothing, and the window moves on."""

from __future__ import annotations

import pytest

from replay_console.throttle import ActionLimit, Throttled


def test_per_target_then_per_actor_and_the_window_moves_on() -> None:
    lim = ActionLimit("test-send", per_target=2, per_actor=3, window_s=60)
    lim.take("ep1", "alice", now=0)
    lim.take("ep1", "bob", now=1)
    with pytest.raises(Throttled, match="to this endpoint") as exc:
        lim.take("ep1", "alice", now=2)
    assert exc.value.retry_after_s == 58  # until the first use leaves the window
    lim.take("ep2", "alice", now=3)
    lim.take("ep3", "alice", now=4)  # alice's third
    with pytest.raises(Throttled, match="by you"):
        lim.take("ep4", "alice", now=5)
    lim.take("ep4", "bob", now=5)  # refusals counted nothing against ep4
    lim.take("ep4", "carol", now=6)
    lim.take("ep1", "alice", now=61)  # the first use of ep1 and of alice's left the window


def test_refused_uses_do_not_push_the_window_out() -> None:
    lim = ActionLimit("test-send", per_target=1, per_actor=10, window_s=10)
    lim.take("ep", "a", now=0)
    for t in range(1, 10):
        with pytest.raises(Throttled):
            lim.take("ep", "a", now=t)
    lim.take("ep", "a", now=10)
