"""A receiver's ``Keep-Alive: timeout=N`` bounds how long its idle connection is reused."""

from __future__ import annotations

import math

import pytest

from postbacks.transport.h1 import idle_limit_s


@pytest.mark.parametrize(("header", "limit"), [
    ("timeout=5, max=100", 4.0),  # Node's and Apache's default: a second short of it
    ("max=100, timeout=60", 59.0),
    ("Timeout = 1", 0.5),  # under 2 s: half of it
    ("timeout=0", 0.0),  # never reused
    ("max=100", math.inf),  # no timeout: the pool's own idle limit
    ("timeout=5.5", math.inf),  # not a whole number of seconds: ignored
    ("timeout=abc", math.inf),
    ("xtimeout=5", math.inf),
    ("", math.inf),
    (None, math.inf),
])
def test_the_idle_limit_follows_the_receivers_timeout(header: str | None, limit: float) -> None:
    assert idle_limit_s(header) == limit
