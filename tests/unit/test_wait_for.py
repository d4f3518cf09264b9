"""postbacks.tools.procs.wait_for: the value once the predicate holds; on timeout, what was
waited for and -- given ``progress`` -- the figure at the moment it gave up, not at the start."""

from __future__ import annotations

import itertools

import pytest

from postbacks.tools.procs import wait_for


def test_returns_the_predicates_value() -> None:
    n = itertools.count()
    assert wait_for(lambda: next(n) >= 3 and "done", 5, interval=0.001) == "done"


def test_timeout_names_the_progress_when_it_gave_up() -> None:
    n = itertools.count()
    with pytest.raises(TimeoutError) as err:
        # 0.3 s of 1-ms polls: dozens of predicate calls even on a loaded 2-core host
        wait_for(lambda: next(n) > 10**9, 0.3, interval=0.001, what="a billion",
                 progress=lambda: next(n))
    assert "waiting for a billion; now " in str(err.value)
    now = int(str(err.value).split("; now ")[1].split()[0])
    assert now > 5  # counted during the wait, not before it


def test_a_failing_progress_does_not_hide_the_timeout() -> None:
    def boom() -> int:
        raise OSError("gone")

    with pytest.raises(TimeoutError, match=r"now unknown \(OSError\('gone'\)\)"):
        wait_for(lambda: False, 0.01, interval=0.001, progress=boom)
