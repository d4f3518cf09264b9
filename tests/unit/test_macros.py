"""The macro registry: every macro, loud failures, brace escaping, the snapshot family."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from postbacks.core.macros import (
    MACROS,
    RenderError,
    expand,
    find_macros,
    format_usd_micros,
    get_macro,
    iso_utc,
    macro_names,
)
from postbacks.core.render import RenderError as PublicRenderError
from tests.unit.factories import make_conversion, make_delivery

FULL = make_delivery(conversion=make_conversion(goal_id="g_1"))


def _same(value: str) -> str:
    return value


def _url(value: str) -> str:
    return quote(value, safe="")


EXPECTED = {
    "conversion_id": "cv_1",
    "app_id": "app_1",
    "event_type": "conversion",
    "goal_id": "g_1",
    "payout_usd": "1.250000",
    "payout_usd_micros": "1250000",
    "occurred_at": "1700000200000",
    "occurred_at_iso": "2023-11-14T22:16:40.000Z",
    "source_completed_at": "1700000000000",
    "source_created_at": "1700000100000",
    "idempotency_key": "msg_abc",
    "attempt": "1",
    "endpoint_id": "ep_1",
}


def test_the_expectation_table_covers_every_registered_macro() -> None:
    assert set(EXPECTED) == set(macro_names()) == set(MACROS)


@pytest.mark.parametrize(("name", "value"), sorted(EXPECTED.items()))
def test_every_macro_resolves(name: str, value: str) -> None:
    assert MACROS[name].doc
    assert expand(f"{{{name}}}", FULL, quote=_same) == value


def test_attempt_is_the_number_of_the_attempt_being_made() -> None:
    assert expand("{attempt}", make_delivery(attempt=4), quote=_same) == "5"


@pytest.mark.parametrize(("micros", "text"), [
    (0, "0.000000"), (1, "0.000001"), (1_250_000, "1.250000"), (-1_500_000, "-1.500000"),
    (-1, "-0.000001"), (123_456_789_012, "123456.789012"), (10**18 + 1, "1000000000000.000001"),
])
def test_payout_is_exact_decimal_with_six_places(micros: int, text: str) -> None:
    assert format_usd_micros(micros) == text


@pytest.mark.parametrize(("ms", "iso"), [
    (0, "1970-01-01T00:00:00.000Z"),
    (1_700_000_200_123, "2023-11-14T22:16:40.123Z"),
    (-1, "1969-12-31T23:59:59.999Z"),
    (-62_135_596_800_000, "0001-01-01T00:00:00.000Z"),  # strftime's %Y gave "1-01-01..."
    (-50_000_000_000_000, "0385-07-25T07:06:40.000Z"),
    (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
])
def test_iso_utc(ms: int, iso: str) -> None:
    assert iso_utc(ms) == iso


@pytest.mark.parametrize("ms", [253_402_300_800_000, -62_135_596_800_001, 2**62])
def test_a_time_no_date_can_show_is_a_render_error(ms: int) -> None:
    """From a producer other than the fan-out (which refuses such times): the delivery
    fails to render (render_failed), not the agent's batch (internal_error)."""
    with pytest.raises(PublicRenderError, match=f"time {ms} is outside"):
        iso_utc(ms)


@pytest.mark.parametrize(("template", "message"), [
    ("{conversionId}", "unknown macro {conversionId}"),   # renamed = unknown
    ("{payout}", "unknown macro {payout}"),
    ("{ conversion_id }", "unknown macro { conversion_id }"),
    ("{snapshot.}", "unknown macro {snapshot.}"),
    ("{snapshot}", "unknown macro {snapshot}"),
])
def test_unknown_macros_are_render_errors(template: str, message: str) -> None:
    with pytest.raises(RenderError) as err:
        expand(template, FULL, quote=_same)
    assert str(err.value) == message


@pytest.mark.parametrize(("template", "delivery"), [
    ("{goal_id}", make_delivery()),  # goal_id None
    ("{payout_usd}", make_delivery(conversion=make_conversion(payout_usd_micros=None))),
    ("{payout_usd_micros}", make_delivery(conversion=make_conversion(payout_usd_micros=None))),
    ("{source_completed_at}",
     make_delivery(conversion=make_conversion(source_completed_at=None))),
    ("{source_created_at}", make_delivery(conversion=make_conversion(source_created_at=None))),
    ("{snapshot.missing}", FULL),
    ("{snapshot.blank}", make_delivery(conversion=make_conversion(source_snapshot={"blank": " "}))),
    ("{goal_id}", make_delivery(conversion=make_conversion(goal_id=""))),
])
def test_empty_resolving_macros_are_render_errors(template: str, delivery: object) -> None:
    name = template[1:-1]
    with pytest.raises(RenderError, match=f"macro \\{{{name}\\}} resolved empty"):
        expand(template, delivery, quote=_same)  # type: ignore[arg-type]


@pytest.mark.parametrize(("template", "out"), [
    ("plain", "plain"),
    ("", ""),
    ("{{literal}}", "{literal}"),
    ("a}}b{{c", "a}b{c"),
    ("{{{conversion_id}}}", "{cv_1}"),
    ("x={conversion_id}&y={conversion_id}", "x=cv_1&y=cv_1"),
])
def test_doubled_braces_are_literal(template: str, out: str) -> None:
    assert expand(template, FULL, quote=_same) == out


@pytest.mark.parametrize("template", [
    "{", "}", "{}", "a{b", "a}b", "{conversion_id}}", "{a{b}", "{{conversion_id}}}",
])
def test_malformed_braces_are_render_errors(template: str) -> None:
    with pytest.raises(RenderError, match="malformed template"):
        expand(template, FULL, quote=_same)
    with pytest.raises(RenderError, match="malformed template"):
        find_macros(template)


def test_find_macros_lists_placeholders_once_in_order_and_skips_escapes() -> None:
    template = "{b}{{x}}{a}{b}{snapshot.k}"
    assert find_macros(template) == ["b", "a", "snapshot.k"]


def test_snapshot_macros_read_raw_snapshot_fields() -> None:
    assert expand("{snapshot.player_id}/{snapshot.amount}", FULL, quote=_same) == "p1/1.25"
    macro = get_macro("snapshot.player_id")
    assert macro is not None and macro.resolve(FULL) == "p1"


def test_quote_applies_to_values_only() -> None:
    d = make_delivery(conversion=make_conversion(source_snapshot={"q": "a&b=c d/é"}))
    out = expand("https://x.test/p?a={snapshot.q}&b=1", d, quote=_url)
    assert out == "https://x.test/p?a=a%26b%3Dc%20d%2F%C3%A9&b=1"


def test_registry_is_read_only_and_render_error_is_the_public_one() -> None:
    with pytest.raises(TypeError):
        MACROS["x"] = MACROS["app_id"]  # type: ignore[index]
    assert RenderError is PublicRenderError
    assert get_macro("nope") is None
