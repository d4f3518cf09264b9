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
