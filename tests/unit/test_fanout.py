from __future__ import annotations

import pytest

from postbacks.core.endpoint import Endpoint
from postbacks.core.fanout import check_conversion, plan_deliveries, validate_conversion
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


NOW = 1_700_000_300_000


@pytest.mark.parametrize(("over", "words"), [
    ({"conversion_id": "cv\x00"}, "conversion_id holds a NUL character"),
    ({"source_snapshot": {"a\x00": "1"}}, "source_snapshot 'a\\x00' hold(s) a NUL"),
    ({"goal_id": "g" * 201}, "goal_id is 201 characters long (at most 200)"),
    ({"event_type": "Conversion"}, "event_type 'Conversion' is not a known event type"),
    ({"payout_usd_micros": 10**12 + 1}, "payout_usd_micros 1000000000001 is over"),
    ({"occurred_at": 1_700_000_200}, "before 2000-01-01T00:00:00Z: epoch seconds"),
    ({"occurred_at": NOW + 3_600_001}, "more than 60 minutes ahead of the clock"),
    ({"payout_usd_micros": -1}, "payout_usd_micros -1 is negative"),
    ({"source_completed_at": -1}, "source_completed_at -1 is outside 1970-01-01 .. 9999"),
    # epoch seconds: the retrodating guard compared them as ms and never saw a retrodate
    ({"source_completed_at": 1_694_000_000}, "source_completed_at 1694000000 is before 2000"),
    ({"source_created_at": 946_684_799_999}, "source_created_at 946684799999 is before 2000"),
    ({"source_created_at": 253_402_300_800_000}, "source_created_at 253402300800000 is out"),
    ({"conversion_id": "x\x1f\x01conversion"}, "conversion_id 'x\\x1f\\x01conversion' holds a co"),
    ({"goal_id": "g\n1"}, "goal_id 'g\\n1' holds a control character"),
    ({"app_id": "a\x7f"}, "app_id 'a\\x7f' holds a control character"),
    # what no one sees matched no endpoint: the conversion reached no one, without a trace
    ({"app_id": "app_1 "}, "app_id 'app_1 ' has whitespace at an end"),
    ({"app_id": "app_1\u200b"}, "app_id 'app_1\\u200b' has whitespace at an end or an inv"),
    ({"app_id": "\xa0app_1"}, "app_id '\\xa0app_1' has whitespace"),
    ({"app_id": "app\u202e1"}, "an invisible character"),
    # a USD payout labelled with a currency no one could read
    ({"original_currency": "usd "}, "original_currency 'usd ' is not a three-letter ISO"),
    ({"original_currency": "US$\u202e"}, "is not a three-letter ISO 4217 code"),
    ({"original_currency": "EUR" * 1000}, "is not a three-letter ISO 4217 code"),
    ({"original_amount": "1e5"}, "original_amount '1e5' is not a decimal number"),
    ({"original_amount": "12,50"}, "is not a decimal number"),
])
def test_a_value_a_later_stage_cannot_hold_is_invalid_and_named(over: dict[str, object],
                                                                 words: str) -> None:
    with pytest.raises(InvalidRecord) as e:
        check_conversion(make_conversion(**over), NOW)
    assert words in str(e.value) and e.value.reason == "invalid_record"


def test_values_at_the_limits_pass() -> None:
    check_conversion(make_conversion(goal_id="g" * 200, payout_usd_micros=10**12,
                                     occurred_at=NOW + 3_600_000), NOW)
    check_conversion(make_conversion(occurred_at=946_684_800_000, payout_usd_micros=None), NOW)
    check_conversion(make_conversion(payout_usd_micros=0, source_completed_at=946_684_800_000,
                                     source_created_at=253_402_300_799_999,
                                     conversion_id="cv é ü 漢 - _ . : / @"), NOW)
    check_conversion(make_conversion(app_id="App_1", original_currency="JPY",
                                     original_amount="1500.25"), NOW)
    check_conversion(make_conversion(original_currency="", original_amount=""), NOW)
    # only the id that routes is held to it: other ids are carried as they are
    check_conversion(make_conversion(conversion_id="cv\u2028 ", goal_id="\u2028\ufeff"), NOW)


def test_ids_with_a_separator_in_them_cannot_share_a_delivery() -> None:
    """The derived ids join (endpoint, conversion, event type, goal) with control
    characters: two conversions whose ids move one part into the other share a delivery id
    (as here). The fan-out refuses a control character in an id, so neither gets one."""
    from postbacks.core.identity import delivery_id

    a = ("ep", "x", "conversion", "w\x1f\x01conversion\x1f\x01g2")
    b = ("ep", "x\x1f\x01conversion\x1f\x01w", "conversion", "g2")
    assert delivery_id(*a) == delivery_id(*b)
    for conv, goal in ((a[1], a[3]), (b[1], b[3])):
        with pytest.raises(InvalidRecord, match="control character"):
            check_conversion(make_conversion(conversion_id=conv, goal_id=goal), NOW)
