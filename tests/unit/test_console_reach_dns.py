"""The console's SSRF check of a typed URL waits for its DNS lookup at most LOOKUP_S, on
threads of its own: it runs while a database connection (and for an edit & replay the
replay lock) is held, and a name whose servers never answer held them for as long as the
resolver tried, stalling every other replay and, four at once, every sign-in check."""

from __future__ import annotations

import threading
import time

import pytest

import replay_console.reach as reach


def test_a_lookup_that_never_answers_is_refused_when_the_wait_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reach, "LOOKUP_S", 0.3)
    release = threading.Event()

    def hangs(host: str) -> list[str]:
        release.wait(10)
        return ["93.184.216.34"]

    try:
        started = time.monotonic()
        why = reach.check_target("https://slow.example/hook", allow_loopback=False,
                                 lookup=hangs)
        took = time.monotonic() - started
        assert why is not None and "does not resolve" in why
        assert took < 2.0, took
        # every lookup thread stuck: the next ones wait their turn, bounded all the same
        started = time.monotonic()
        for _ in range(reach.LOOKUP_THREADS + 2):
            assert reach.check_target("https://slow.example/x", allow_loopback=False,
                                      lookup=hangs) is not None
        assert time.monotonic() - started < (reach.LOOKUP_THREADS + 2) * 0.3 + 2.0
    finally:
        release.set()


def test_a_lookup_that_answers_is_judged_as_before() -> None:
    assert reach.check_target("https://ok.example/hook", allow_loopback=False,
                              lookup=lambda h: ["93.184.216.34"]) is None
    why = reach.check_target("https://inside.example/hook", allow_loopback=False,
                             lookup=lambda h: ["10.0.0.5"])
    assert why is not None and "does not resolve to an address postbacks may send to" in why
