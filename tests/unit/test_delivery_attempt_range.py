"""Every stage decodes deliveries with the codec, and each writes ``attempt + 1`` into an
Avro int (outcomes, attempts): a delivery whose ``attempt`` is near 2**31 is refused at
decode, ``invalid_record``, before any stage can fail on it."""

from __future__ import annotations

from typing import Any

import pytest

from postbacks.codec import MAX_ATTEMPT, codec_for
from postbacks.core.outcomes import make_outcome
from postbacks.errors import InvalidRecord
from tests.unit.factories import make_delivery

_DLV = codec_for("Delivery")


@pytest.mark.parametrize("attempt", [2**31 - 1, MAX_ATTEMPT + 1, -1])
def test_an_attempt_out_of_range_is_an_invalid_record(attempt: int) -> None:
    raw = _DLV.encode(make_delivery(attempt=attempt))
    with pytest.raises(InvalidRecord, match=f"attempt {attempt} is outside"):
        _DLV.decode(raw)


def test_the_largest_attempt_taken_still_fits_its_outcome() -> None:
    d = _DLV.decode(_DLV.encode(make_delivery(attempt=MAX_ATTEMPT)))
    codec_for("Outcome").encode(make_outcome(d, "delivered", now_ms=1))


def test_a_stored_delivery_past_the_range_is_a_named_error_on_re_drive() -> None:
    """A row counted past the range (a foreign delivery the agent sent before the check)
    is one delivery's error in a replay, a release or a re-render: it used to escape as
    InvalidRecord and stop the replay drainer for every endpoint."""
    from replay_console.held import redrive_record

    conv: Any = make_delivery()["conversion"]
    with pytest.raises(ValueError, match="dlv_x: stored snapshot is not a valid delivery"):
        redrive_record(delivery_id="dlv_x", endpoint_id="ep_1", idempotency_key="k",
                       snapshot=dict(conv), created_at_ms=1, attempt=MAX_ATTEMPT + 1,
                       trigger="manual", actor="alice", now_ms=2)
