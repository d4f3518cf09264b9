from __future__ import annotations

import pytest

from postbacks.core.endpoint import Endpoint
from postbacks.core.fanout import plan_deliveries, validate_conversion
from postbacks.errors import InvalidRecord
from tests.unit.factories import make_conversion

KEY = b"k" * 32


def ep(endpoint_id: str, app: str = "app_1", types: set[str] | None = None,
       enabled: bool = True) -> Endpoint:
    return Endpoint(endpoint_id, app, f"https://x.test/{endpoint_id}",
                    frozenset(types or {"*"}), enabled=enabled)


def test_one_delivery_per_subscribed_endpoint() -> None:
    endpoints = [ep("ep_a"), ep("ep_b", types={"conversion"}), ep("ep_c", types={"reward"}),
                 ep("ep_d", app="app_2"), ep("ep_e", enabled=False)]
    out = plan_deliveries(make_conversion(), endpoints, idem_key=KEY, now_ms=5)
    assert [d["endpoint_id"] for d in out] == ["ep_a", "ep_b"]
    assert all(d["attempt"] == 0 and d["trigger"] == "initial" for d in out)
    assert all(d["conversion"]["conversion_id"] == "cv_1" for d in out)
    assert len({d["delivery_id"] for d in out}) == 2


def test_refanning_gives_the_same_ids_and_keys() -> None:
    a = plan_deliveries(make_conversion(), [ep("ep_a")], idem_key=KEY, now_ms=1)
    b = plan_deliveries(make_conversion(event_id="evt_2"), [ep("ep_a")], idem_key=KEY, now_ms=9)
    assert (a[0]["delivery_id"], a[0]["idempotency_key"]) == (
        b[0]["delivery_id"], b[0]["idempotency_key"])


def test_no_subscriber_is_not_an_error() -> None:
    assert plan_deliveries(make_conversion(app_id="nobody"), [ep("ep_a")], idem_key=KEY,
                           now_ms=1) == []


@pytest.mark.parametrize("field", ["event_id", "conversion_id", "app_id", "event_type"])
@pytest.mark.parametrize("value", ["", "   "])
def test_missing_required_fields_are_invalid(field: str, value: str) -> None:
    with pytest.raises(InvalidRecord, match=field) as info:
        validate_conversion(make_conversion(**{field: value}))
    assert info.value.reason == "missing_field"


def test_non_positive_occurred_at_is_invalid() -> None:
    with pytest.raises(InvalidRecord, match="occurred_at"):
        validate_conversion(make_conversion(occurred_at=0))
