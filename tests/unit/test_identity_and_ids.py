from __future__ import annotations

import pytest

from postbacks.core.identity import delivery_id, idempotency_key
from postbacks.ids import derived_id, new_id

KEY = b"k" * 32


def test_delivery_id_is_deterministic_and_prefixed() -> None:
    a = delivery_id("ep_1", "cv_1", "conversion", None)
    assert a == delivery_id("ep_1", "cv_1", "conversion", None)
    assert a.startswith("dlv_") and len(a) == 4 + 26


@pytest.mark.parametrize(
    "other",
    [
        ("ep_2", "cv_1", "conversion", None),
        ("ep_1", "cv_2", "conversion", None),
        ("ep_1", "cv_1", "reward", None),
        ("ep_1", "cv_1", "conversion", "g1"),
        ("ep_1", "cv_1", "conversion", ""),  # empty goal is not "no goal"
    ],
)
def test_each_identity_part_changes_the_id(other: tuple[str, str, str, str | None]) -> None:
    base = ("ep_1", "cv_1", "conversion", None)
    assert delivery_id(*base) != delivery_id(*other)
    assert idempotency_key(KEY, *base) != idempotency_key(KEY, *other)


def test_parts_cannot_be_shifted_into_each_other() -> None:
    assert derived_id("x", "ab", "c") != derived_id("x", "a", "bc")


def test_idempotency_key_is_opaque_and_keyed() -> None:
    k = idempotency_key(KEY, "ep_secret_name", "cv_123", "conversion", None)
    assert k.startswith("msg_")
    assert "ep_secret_name" not in k and "cv_123" not in k
    assert k == idempotency_key(KEY, "ep_secret_name", "cv_123", "conversion", None)
    assert k != idempotency_key(b"other-key", "ep_secret_name", "cv_123", "conversion", None)


def test_new_ids_sort_by_time() -> None:
    earlier = new_id("att", 1_700_000_000_000, b"\xff" * 10)
    later = new_id("att", 1_700_000_000_001, b"\x00" * 10)
    assert earlier < later
    assert new_id("att", 1) != new_id("att", 1)
