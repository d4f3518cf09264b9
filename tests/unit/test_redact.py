from __future__ import annotations

import orjson
import pytest

from postbacks.core.outcomes import make_attempt
from postbacks.core.redact import MASK, redact_request
from postbacks.core.render import RenderedRequest
from tests.unit.factories import make_delivery


def _req(url: str, body: bytes, ctype: str) -> RenderedRequest:
    return RenderedRequest("POST", url, {"content-type": ctype, "webhook-signature": "v1,abc",
                                         "authorization": "Bearer s3cret"}, body)


def test_json_fields_are_masked_at_any_depth_and_the_query_too() -> None:
    req = _req("https://p.example/cb?email=a%40b.c&cid=1",
               orjson.dumps({"data": {"email": "a@b.c", "payout_usd": "1.0"}, "email": "x"}),
               "application/json")
    shown = redact_request(req, ("email",))
    body = orjson.loads(shown.body)
    assert body == {"data": {"email": MASK, "payout_usd": "1.0"}, "email": MASK}
    assert "a%40b.c" not in shown.url and "cid=1" in shown.url
    assert req.body != shown.body  # the request as sent is untouched


def test_form_bodies_are_masked() -> None:
    req = _req("https://p.example/cb", b"player=p1&email=a%40b.c",
               "application/x-www-form-urlencoded")
    assert b"a%40b.c" not in redact_request(req, ("email",)).body


@pytest.mark.parametrize("fields", [(), ("nothing",)])
def test_nothing_to_mask_keeps_the_bytes(fields: tuple[str, ...]) -> None:
    req = _req("https://p.example/cb", b'{"a":1}', "application/json")
    assert redact_request(req, fields).body == b'{"a":1}'


def test_attempt_records_never_store_signatures_or_credentials() -> None:
    req = _req("https://p.example/cb", b"{}", "application/json")
    rec = make_attempt(make_delivery(), now_ms=1, result="delivered", req=req)
    assert rec["request_headers"]["webhook-signature"] == "[redacted]"
    assert rec["request_headers"]["authorization"] == "[redacted]"
    assert rec["request_body"] == b"{}"


def test_the_endpoints_custom_header_values_are_masked_whatever_their_case() -> None:
    from postbacks.core.redact import Redaction

    req = RenderedRequest("POST", "https://p.example/cb?email=a%40b.c",
                          {"content-type": "application/json", "X-Api-Key": "k-live-123",
                           "x-partner-token": "t0k", "idempotency-key": "dlv_1"},
                          b'{"email":"a@b.c"}')
    custom = {"x-api-key": "k-live-123", "X-Partner-Token": "t0k"}
    only_headers = redact_request(req, Redaction.of((), custom))
    assert only_headers.headers == {"content-type": "application/json", "X-Api-Key": MASK,
                                    "x-partner-token": MASK, "idempotency-key": "dlv_1"}
    assert only_headers.body == req.body and only_headers.url == req.url
    both = redact_request(req, Redaction.of(("email",), {"X-API-KEY": "k-live-123"}))
    assert both.headers["X-Api-Key"] == MASK and both.headers["x-partner-token"] == "t0k"
    assert b"a@b.c" not in both.body and "a%40b.c" not in both.url
    rec = make_attempt(make_delivery(), now_ms=1, result="delivered", req=only_headers)
    assert "k-live-123" not in str(rec["request_headers"]) and "t0k" not in str(rec)
    assert req.headers["X-Api-Key"] == "k-live-123"  # the request as sent is untouched


def test_a_receiver_echoing_the_api_key_has_it_masked_in_the_stored_excerpt() -> None:
    from postbacks.core.redact import Redaction

    r = Redaction.of((), {"X-Api-Key": "k-live-123", "X-Short": "abc"})
    assert r.scrub(b'{"you sent":"k-live-123","x":"abc"}') == (
        b'{"you sent":"[redacted]","x":"abc"}')  # a value under 6 characters stays
    assert r.scrub(None) is None and Redaction().scrub(b"k-live-123") == b"k-live-123"


def test_a_secret_straddling_the_excerpt_cut_is_masked_not_half_kept() -> None:
    from postbacks.core.redact import MASK, Redaction

    key = "sk_live_0123456789abcdef0123456789abcdef"
    r = Redaction.of((), {"X-Api-Key": key})
    body = b"x" * 240 + b'"' + key.encode() + b'"' + b"y" * 100
    shown = r.excerpt(body, 256)
    assert shown is not None and len(shown) == 256 and b"sk_live" not in shown
    assert shown.startswith(b"x" * 240 + b'"' + MASK.encode()[:15])
    assert r.excerpt(None, 256) is None and Redaction().excerpt(body, 256) == body[:256]


def test_echoed_field_values_and_a_bearer_credential_are_masked_in_the_excerpt() -> None:
    from postbacks.core.redact import Redaction

    req = _req("https://p.example/cb?phone=%2B15551234567",
               orjson.dumps({"user": {"email": "alice@example.com", "age": 12345678},
                             "cid": "cv_1"}), "application/json")
    r = Redaction.of(("email", "phone", "age"), {"Authorization": "Bearer sk_live_abc/def"})
    r = r.echoing(req)
    echo = (b'{"got":"alice@example.com","phone":"+15551234567","age":12345678,'
            b'"token":"sk_live_abc\\/def","cid":"cv_1"}')
    shown = r.excerpt(echo, 256)
    assert shown is not None
    for secret in (b"alice@example.com", b"+15551234567", b"12345678", b"sk_live_abc"):
        assert secret not in shown, (secret, shown)
    assert b'"cid":"cv_1"' in shown  # a field not named stays
    assert Redaction.of((), {}).echoing(req).secrets == ()  # nothing named, nothing masked
    form = RenderedRequest("POST", "https://p.example/cb", {
        "content-type": "application/x-www-form-urlencoded"}, b"email=bob%40example.org&x=1")
    assert Redaction.of(("email",), {}).echoing(form).scrub_text(
        "rejected bob@example.org") == "rejected [redacted]"


def test_echo_masking_does_not_eat_unrelated_bytes() -> None:
    """A field's value is masked where it stands as a word of its own, and only a known
    auth scheme's credential is masked apart from its header's whole value."""
    from postbacks.core.redact import Redaction

    req = _req("https://p.example/cb?zip=123456&city=Cupertino", b"", "application/json")
    r = Redaction.of(("zip", "city"), {"X-Org": "Acme Holdings",
                                       "Authorization": "Basic dXNlcjpwYXNz"}).echoing(req)
    shown = r.scrub(b'{"zip":"123456","ts":1700000123456,"id":"A-1234567",'
                    b'"city":"Cupertino","cities":"Cupertinos","org":"Holdings",'
                    b'"auth":"dXNlcjpwYXNz"}')
    assert shown == (b'{"zip":"[redacted]","ts":1700000123456,"id":"A-1234567",'
                     b'"city":"[redacted]","cities":"Cupertinos","org":"Holdings",'
                     b'"auth":"[redacted]"}')
