"""When a delivery row projected from what the sink folded into it is final, so the sink
can skip the projection statement for it (``sinks.tables.settled``)."""

from __future__ import annotations

from typing import Any

from postbacks.core.outcomes import make_attempt, make_outcome
from sinks.tables import TABLES, settled
from tests.unit.factories import make_delivery

T0 = 1_750_000_000_000


def _attempt(no: int, at: int, error: str | None = None) -> tuple[Any, ...]:
    d = make_delivery(delivery_id="dlv_x")
    return TABLES["attempts"].row(make_attempt(
        {**d, "attempt": no - 1}, now_ms=at, attempted_at=at,
        result="delivered" if error is None else "retry", req=None, error_class=error))


def _outcome(kind: str, at: int, attempt_no: int | None) -> tuple[Any, ...]:
    d = make_delivery(delivery_id="dlv_x")
    row = TABLES["outcomes"].row(make_outcome(d, kind, now_ms=at, attempt_no=attempt_no))
    return row if attempt_no is not None else (*row[:5], None, *row[6:])


def test_delivered_by_the_highest_attempt_folded_in_is_settled() -> None:
    assert settled([_outcome("delivered", T0 + 1, 1)], [_attempt(1, T0)])
    assert settled([_outcome("failing", T0 + 1, 1), _outcome("delivered", T0 + 5001, 2)],
                   [_attempt(2, T0 + 5000), _attempt(1, T0, "http_500")])


def test_anything_less_is_not() -> None:
    assert not settled([], [_attempt(1, T0)])  # no outcome
    assert not settled([_outcome("delivered", T0 + 1, 2)], [])  # its attempt not folded in
    # the attempt the outcome reports is not the highest folded in (a replay's, say)
    assert not settled([_outcome("delivered", T0 + 1, 1)],
                       [_attempt(1, T0), _attempt(2, T0 + 10)])
    # ... or missing (read before the row, or by another sink)
    assert not settled([_outcome("delivered", T0 + 5001, 2)], [_attempt(1, T0, "timeout")])
    assert not settled([_outcome("failing", T0 + 1, 1)], [_attempt(1, T0, "http_500")])
    assert not settled([_outcome("held", T0, 1)], [])
    # a delivery marked delivered by hand (no attempt number)
    assert not settled([_outcome("delivered", T0 + 1, None)], [_attempt(1, T0)])
    # the latest outcome decides: a later non-delivered one is not settled
    assert not settled([_outcome("delivered", T0 + 1, 1), _outcome("replayed", T0 + 9, 1)],
                       [_attempt(1, T0)])
