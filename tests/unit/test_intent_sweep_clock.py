"""The sink's sweep of lost intents runs on a monotonic schedule: the wall clock stepped
back (NTP) does not stop it for as long as the step."""

from __future__ import annotations

from sinks.intents import IntentBook


def test_a_wall_clock_stepped_back_does_not_stop_the_sweep() -> None:
    wall = [1_700_000_000.0]
    ticks = [100.0]
    book = IntentBook(60, sweep_s=10, clock=lambda: wall[0], ticks=lambda: ticks[0])
    assert book.sweep_due()  # the first flush sweeps
    book._last_sweep = ticks[0]
    wall[0] -= 7200  # stepped back two hours
    ticks[0] += 11
    assert book.sweep_due()
    book._last_sweep = ticks[0]
    wall[0] += 7200 * 3  # and forward: no sweep storm either
    ticks[0] += 1
    assert not book.sweep_due()
