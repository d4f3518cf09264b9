"""Providers: V3 envelope versions/fields/aliases, V2 URL macros, the partner provider,
and the registry. Signatures are verified with the ``standardwebhooks`` library."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

import orjson
import pytest
from standardwebhooks import Webhook

from postbacks.core.endpoint import Endpoint, EndpointConfig, SigningSecret, ValidatorSpec
from postbacks.core.providers import base, get_provider, provider_names, register
from postbacks.core.providers.base import Provider
from postbacks.core.render import RenderedRequest, RenderError, render
from postbacks.core.signing import decode_secret, generate_secret
from postbacks.records import DeliveryRecord
from tests.unit.factories import make_conversion, make_delivery

NOW_MS = int(time.time() * 1000)


@pytest.fixture(autouse=True)
def _fresh_now() -> None:
    """Signatures are verified with the real clock (5-minute tolerance): sign with a fresh
    time in every test, however long the suite has been running."""
    global NOW_MS
    NOW_MS = int(time.time() * 1000)
SECRET = generate_secret(b"\x07" * 32)
V1_KEYS = ["conversion_id", "app_id", "event_type", "goal_id", "payout_usd", "occurred_at"]


def _ep(
    provider: str = "v3", url: str = "https://pub.example/hook", *,
    secrets: tuple[SigningSecret, ...] | None = None, **config: Any,
) -> Endpoint:
    return Endpoint(
        "ep_1", "app_1", url, frozenset({"*"}), provider=provider,
        secrets=(SigningSecret("s1", decode_secret(SECRET), 0),) if secrets is None else secrets,
        config=EndpointConfig.from_json(config),
    )


def _data(req: RenderedRequest) -> dict[str, Any]:
    envelope = orjson.loads(req.body)
    assert set(envelope) == {"schema_version", "type", "id", "data"}
    data: dict[str, Any] = envelope["data"]
    return data


def _problems(ep: Endpoint) -> list[str]:
    return get_provider(ep.provider).check_config(ep)


# --- registry ---------------------------------------------------------------------------

def test_builtin_providers_are_registered() -> None:
    assert {"v2", "v3", "partner"} <= set(provider_names())
    assert get_provider("partner").default_validator == ValidatorSpec("non_empty_body")
    assert get_provider("v3").default_validator is None


def test_unknown_provider_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="unknown provider 'nope'"):
        get_provider("nope")


def test_adding_a_provider_is_one_class_and_one_register_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))

    class Ping(Provider):
        name = "ping"
        options: ClassVar[frozenset[str]] = frozenset({"path"})

        def render(self, d: DeliveryRecord, endpoint: Endpoint, *, now_ms: int) -> RenderedRequest:
            return RenderedRequest("GET", endpoint.url, {}, b"")

    register(Ping())
    ep = _ep("ping", provider_options={"path": "/x"})
    assert render(make_delivery(), ep, now_ms=NOW_MS).method == "GET"
    assert _problems(ep) == []
    assert "ping" in provider_names()
    with pytest.raises(ValueError, match="already registered"):
        register(Ping())


def test_config_error_renders_nothing() -> None:
    ep = Endpoint("ep_1", "app_1", "https://x.test", frozenset({"*"}), config_error="bad key")
    with pytest.raises(RenderError, match="bad key"):
        render(make_delivery(), ep, now_ms=NOW_MS)


# --- v3 ---------------------------------------------------------------------------------

def test_v3_version_1_exact_bytes_and_headers() -> None:
    d = make_delivery(attempt=2)
    req = render(d, _ep(), now_ms=NOW_MS)
    assert req.body == orjson.dumps({
        "schema_version": 1, "type": "conversion", "id": "msg_abc",
        "data": {"conversion_id": "cv_1", "app_id": "app_1", "event_type": "conversion",
                 "goal_id": None, "payout_usd": "1.250000", "occurred_at": 1_700_000_200_000},
    })
    assert (req.method, req.url) == ("POST", "https://pub.example/hook")
    assert list(req.headers) == [
        "content-type", "webhook-id", "webhook-timestamp", "webhook-signature",
        "idempotency-key", "postback-attempt",
    ]
    assert req.headers["postback-attempt"] == "3"
    assert req.headers["webhook-timestamp"] == str(NOW_MS // 1000)
    Webhook(SECRET).verify(req.body, req.headers)


def test_v3_version_2_changes_occurred_at_type_and_keeps_new_fields_off() -> None:
    req = render(make_delivery(), _ep(schema_version=2), now_ms=NOW_MS)
    envelope = orjson.loads(req.body)
    assert envelope["schema_version"] == 2
    assert list(envelope["data"]) == V1_KEYS
    assert envelope["data"]["occurred_at"] == "2023-11-14T22:16:40.000Z"
    Webhook(SECRET).verify(req.body, req.headers)


@pytest.mark.parametrize(("conversion", "expected"), [
    (make_conversion(),
     {"payout_usd_micros": 1_250_000, "source_completed_at": "2023-11-14T22:13:20.000Z",
      "source_created_at": "2023-11-14T22:15:00.000Z", "currency": "USD"}),
    (make_conversion(payout_usd_micros=None, source_completed_at=None,
                     source_created_at=None, original_currency="EUR"),
     {"payout_usd_micros": None, "source_completed_at": None, "source_created_at": None,
      "currency": "EUR"}),
])
def test_v3_version_2_opt_in_fields_when_listed(
    conversion: Any, expected: Mapping[str, Any],
) -> None:
    fields = ["conversion_id", *expected]
    req = render(make_delivery(conversion=conversion), _ep(schema_version=2, fields=fields),
                 now_ms=NOW_MS)
    assert _data(req) == {"conversion_id": "cv_1", **expected}


@pytest.mark.parametrize(("config", "data"), [
    ({"fields": ["payout_usd", "conversion_id"]},  # canonical order, not listing order
     {"conversion_id": "cv_1", "payout_usd": "1.250000"}),
    ({"fields": ["conversion_id"], "aliases": {"conversion_id": "cid"}}, {"cid": "cv_1"}),
    ({"aliases": {"payout_usd": "amount", "goal_id": "goal"}},
     {"conversion_id": "cv_1", "app_id": "app_1", "event_type": "conversion", "goal": None,
      "amount": "1.250000", "occurred_at": 1_700_000_200_000}),
    ({"fields": ["app_id"], "aliases": {"payout_usd": "app_id"}}, {"app_id": "app_1"}),
])
def test_v3_subset_and_aliases(config: dict[str, Any], data: dict[str, Any]) -> None:
    ep = _ep(**config)
    assert _problems(ep) == []
    req = render(make_delivery(), ep, now_ms=NOW_MS)
    assert _data(req) == data
    assert list(_data(req)) == list(data)
    Webhook(SECRET).verify(req.body, req.headers)


@pytest.mark.parametrize(("config", "problem"), [
    ({"fields": ["payout_usd_micros"]}, "field 'payout_usd_micros' is not in schema version 1"),
    ({"schema_version": 2, "fields": ["nope"]}, "field 'nope' is not in schema version 2"),
    ({"fields": ["app_id", "app_id"]}, "field 'app_id' is listed twice"),
    ({"fields": []}, "fields is empty"),
    ({"aliases": {"nope": "x"}}, "alias for unknown field 'nope'"),
    ({"aliases": {"app_id": " "}}, "alias for field 'app_id' is empty"),
    ({"aliases": {"conversion_id": "app_id"}},
     "fields 'conversion_id' and 'app_id' would both be sent as 'app_id'"),
    ({"aliases": {"conversion_id": "k", "app_id": "k"}}, "would both be sent as 'k'"),
    ({"schema_version": 9}, "unknown schema_version 9"),
    ({"headers": {"Webhook-Signature": "forged"}}, "may not override"),
    ({"headers": {"content-type": "text/plain"}}, "may not override"),
    ({"headers": {"bad header": "x"}}, "not a valid HTTP token"),
    ({"headers": {"x-ok": "a\r\nb"}}, "control character"),
])
def test_v3_bad_config_is_a_check_problem_and_a_render_error(
    config: dict[str, Any], problem: str,
) -> None:
    ep = _ep(**config)
    assert any(problem in p for p in _problems(ep)), _problems(ep)
    with pytest.raises(RenderError, match=problem.split("'")[0]):
        render(make_delivery(), ep, now_ms=NOW_MS)


def test_v3_unknown_provider_option_is_a_check_problem() -> None:
    assert _problems(_ep(provider_options={"x": 1})) == [
        "provider 'v3' does not accept option(s): x"
    ]


def test_v3_custom_headers_are_added_and_signature_still_verifies() -> None:
    req = render(make_delivery(), _ep(headers={"X-Pub-Token": "t0k"}), now_ms=NOW_MS)
    assert req.headers["X-Pub-Token"] == "t0k"
    Webhook(SECRET).verify(req.body, req.headers)


# --- v2 ---------------------------------------------------------------------------------

V2_URL = "https://pub.example/cb?cid={conversion_id}&amt={payout_usd}&p={snapshot.player_id}"


def test_v2_expands_url_macros_with_quoting_and_signs_the_request_target() -> None:
    d = make_delivery(conversion=make_conversion(
        conversion_id="cv/1&x=2", source_snapshot={"player_id": "a b+é"}))
    req = render(d, _ep("v2", V2_URL), now_ms=NOW_MS)
    assert req.method == "GET" and req.body == b""
    assert req.url == "https://pub.example/cb?cid=cv%2F1%26x%3D2&amt=1.250000&p=a%20b%2B%C3%A9"
    assert dict(parse_qsl(urlsplit(req.url).query)) == {
        "cid": "cv/1&x=2", "amt": "1.250000", "p": "a b+é"}
    assert "content-type" not in req.headers
    assert req.headers["idempotency-key"] == "msg_abc"
    assert req.headers["postback-attempt"] == "1"
    # the body is empty: the signature covers the request target, so the values in it
    target = "/cb?cid=cv%2F1%26x%3D2&amt=1.250000&p=a%20b%2B%C3%A9"
    assert Webhook(SECRET).verify(target.encode(), req.headers, json_parse=False) is None
    with pytest.raises(Exception):  # noqa: B017 - the library's own verification error
        Webhook(SECRET).verify(b"/cb?cid=cv%2F1%26x%3D2&amt=9.000000&p=a%20b%2B%C3%A9",
                               req.headers, json_parse=False)
    # then the one over the empty body v2 always sent: receivers written against it go on
    target_sig, empty_sig = req.headers["webhook-signature"].split(" ")
    assert Webhook(SECRET).verify(b"", req.headers, json_parse=False) is None
    assert Webhook(SECRET).verify(target.encode(), {**req.headers,
                                  "webhook-signature": target_sig}, json_parse=False) is None
    with pytest.raises(Exception):  # noqa: B017 - the empty body's alone: not the target's
        Webhook(SECRET).verify(target.encode(), {**req.headers,
                               "webhook-signature": empty_sig}, json_parse=False)
    with pytest.raises(Exception):  # noqa: B017
        Webhook(generate_secret(b"\x08" * 32)).verify(target.encode(), req.headers,
                                                      json_parse=False)


@pytest.mark.parametrize(("template", "values", "target"), [
    # a dot-segment value stays a value (yarl resolved /cb/../ok to /ok)
    ("https://pub.example/cb/{snapshot.a}/ok?x=1", {"a": ".."}, "/cb/%2E%2E/ok?x=1"),
    ("https://pub.example/cb/{snapshot.a}", {"a": "."}, "/cb/%2E"),
    # escapes a server reads as separators stay escaped (yarl decoded %3B and %26)
    ("https://pub.example/c/{snapshot.a}?v={snapshot.a}", {"a": "x;y&z/w"},
     "/c/x%3By%26z%2Fw?v=x%3By%26z%2Fw"),
    # the template's own unencoded text is encoded once, its escapes kept
    ("https://pub.example/a b/é?q=1%20{snapshot.a}", {"a": "v"}, "/a%20b/%C3%A9?q=1%20v"),
    ("https://bücher.example?q={snapshot.a}", {"a": "v"}, "/?q=v"),
    # brackets and a stray % in the template's own text are escaped, as yarl did; an
    # internationalized host keeps the target byte for byte
    ("https://pub.example/a?sub[id]={snapshot.a}&p=50%off", {"a": "v"},
     "/a?sub%5Bid%5D=v&p=50%25off"),
    ("https://bücher.example/cb/{snapshot.a}/x", {"a": ".."}, "/cb/%2E%2E/x"),
])
def test_v2_sends_and_signs_the_target_it_rendered(
        template: str, values: dict[str, str], target: str) -> None:
    from postbacks.core.targets import as_sent, request_target

    d = make_delivery(conversion=make_conversion(source_snapshot=values))
    req = render(d, _ep("v2", template), now_ms=NOW_MS)
    assert request_target(req.url) == target
    assert as_sent(req.url).raw_path_qs == target  # what the HTTP client puts on the line
    assert Webhook(SECRET).verify(target.encode(), req.headers, json_parse=False) is None


@pytest.mark.parametrize(("url", "config", "problem"), [
    ("https://pub.example/cb?x={payout}", {}, "unknown macro {payout}"),
    ("https://pub.example/cb?x={payout", {}, "malformed template"),
    ("ftp://pub.example/cb?x={app_id}", {}, "URL scheme must be http or https"),
    ("https://{app_id}.pub.example/cb", {}, "not the host"),
    ("https://pub.example/cb?x=1#cid={conversion_id}", {}, "a fragment"),
    ("https://pub.example/cb?x={app_id}\r\nX-Injected: 1", {}, "control character"),
    ("https://pub.example/cb", {"fields": ["app_id"]}, "fields/aliases apply to v3"),
    ("https://pub.example/cb", {"schema_version": 2}, "schema_version applies to v3 only"),
    ("https://pub.example/cb", {"headers": {"webhook-id": "x"}}, "may not override"),
])
def test_v2_bad_config(url: str, config: dict[str, Any], problem: str) -> None:
    ep = _ep("v2", url, **config)
    assert any(problem in p for p in _problems(ep)), _problems(ep)
    with pytest.raises(RenderError, match=problem.split("{")[0]):
        render(make_delivery(), ep, now_ms=NOW_MS)


def test_v2_empty_resolving_macro_fails_at_render_only() -> None:
    ep = _ep("v2", "https://pub.example/cb?g={goal_id}")
    assert _problems(ep) == []
    with pytest.raises(RenderError, match="resolved empty"):
        render(make_delivery(), ep, now_ms=NOW_MS)


# --- partner ----------------------------------------------------------------------------

def test_partner_posts_a_form_signed_its_own_way() -> None:
    req = render(make_delivery(), _ep("partner"), now_ms=NOW_MS)
    assert req.method == "POST"
    assert req.headers["content-type"] == "application/x-www-form-urlencoded"
    assert parse_qsl(req.body.decode(), keep_blank_values=True) == [
        ("conversion_id", "cv_1"), ("app_id", "app_1"), ("event_type", "conversion"),
        ("goal_id", ""), ("payout_usd", "1.250000"), ("occurred_at", "1700000200000"),
        ("idempotency_key", "msg_abc"),
    ]
    mac = hmac.new(decode_secret(SECRET), req.body, hashlib.sha256).hexdigest()
    assert req.headers["x-partner-signature"] == f"sha256={mac}"
    assert req.headers["x-partner-timestamp"] == str(NOW_MS // 1000)
    assert req.headers["idempotency-key"] == "msg_abc"
    assert req.headers["postback-attempt"] == "1"
    assert not [h for h in req.headers if h.lower().startswith("webhook-")]


def test_partner_honours_subset_and_aliases_and_signs_with_the_first_active_key() -> None:
    first, second = b"\x01" * 32, b"\x02" * 32
    ep = _ep("partner", secrets=(SigningSecret("a", first, 0), SigningSecret("b", second, 0)),
             fields=["conversion_id", "payout_usd"], aliases={"payout_usd": "amount"})
    req = render(make_delivery(), ep, now_ms=NOW_MS)
    assert req.body == b"conversion_id=cv_1&amount=1.250000&idempotency_key=msg_abc"
    mac = hmac.new(first, req.body, hashlib.sha256).hexdigest()
    assert req.headers["x-partner-signature"] == f"sha256={mac}"


@pytest.mark.parametrize(("config", "problem"), [
    ({"aliases": {"conversion_id": "idempotency_key"}}, "would both be sent as"),
    ({"schema_version": 2}, "sends schema version 1 fields only"),
    ({"fields": ["currency"]}, "field 'currency' is not in schema version 1"),
    ({"headers": {"X-Partner-Signature": "x"}}, "may not override"),
])
def test_partner_bad_config(config: dict[str, Any], problem: str) -> None:
    ep = _ep("partner", **config)
    assert any(problem in p for p in _problems(ep)), _problems(ep)
    with pytest.raises(RenderError):
        render(make_delivery(), ep, now_ms=NOW_MS)


@pytest.mark.parametrize("provider", ["v2", "v3", "partner"])
def test_no_active_secret_is_a_render_error_for_every_provider(provider: str) -> None:
    expired = (SigningSecret("old", b"k" * 32, 0, NOW_MS - 1),)
    with pytest.raises(RenderError, match="has no active signing secret"):
        render(make_delivery(), _ep(provider, secrets=expired), now_ms=NOW_MS)
