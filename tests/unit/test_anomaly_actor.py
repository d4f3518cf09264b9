"""The anomaly commands' actor is an audit log's actor: named, short, one line."""

from __future__ import annotations

import pytest

from postbacks.db.anomaly import _check_actor


@pytest.mark.parametrize(("actor", "words"), [
    ("", "actor is required"), ("   ", "actor is required"),
    ("alice\nadmin:root", "no control characters"), ("a" * 201, "at most 200"),
])
def test_a_bad_actor_is_refused(actor: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        _check_actor(actor)


def test_a_good_actor_passes() -> None:
    _check_actor("ops@example.com")
