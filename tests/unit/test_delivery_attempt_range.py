"""Every stage decodes deliveries with the codec, and each writes ``attempt + 1`` into an
Avro int (outcomes, attempts): a delivery whose ``attempt`` is near 2**31 is refused at
decode, ``invalid_record``, before any stage can fail on it."""

from __future__ import annotations

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
