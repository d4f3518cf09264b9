from __future__ import annotations

import time

import pytest
from standardwebhooks import Webhook

from postbacks.core.endpoint import Endpoint, SigningSecret
from postbacks.core.render import RenderError, render
from postbacks.core.signing import decode_secret, generate_secret, sign, verify
from tests.unit.factories import make_delivery

NOW_MS = int(time.time() * 1000)


@pytest.fixture(autouse=True)
def _fresh_now() -> None:
    """Signatures are verified with the real clock (5-minute tolerance): sign with a fresh
    time in every test, however long the suite has been running."""
    global NOW_MS
    NOW_MS = int(time.time() * 1000)


def _endpoint(*secrets: SigningSecret, provider: str = "v3") -> Endpoint:
    return Endpoint("ep_1", "app_1", "https://example.test/hook", frozenset({"*"}),
                    provider=provider, secrets=secrets)


def test_rendered_request_verifies_with_the_standardwebhooks_library() -> None:
    secret = generate_secret(b"\x01" * 32)
    ep = _endpoint(SigningSecret("s1", decode_secret(secret), 0))
    req = render(make_delivery(), ep, now_ms=NOW_MS)
    Webhook(secret).verify(req.body, req.headers)  # raises on mismatch
    assert req.headers["webhook-id"] == req.headers["idempotency-key"]
    assert req.headers["postback-attempt"] == "1"


def test_both_secrets_sign_during_rotation_and_each_verifies() -> None:
    old, new = generate_secret(b"\x01" * 32), generate_secret(b"\x02" * 32)
    ep = _endpoint(
        SigningSecret("old", decode_secret(old), 0, NOW_MS + 60_000),
        SigningSecret("new", decode_secret(new), NOW_MS - 1000),
    )
    req = render(make_delivery(), ep, now_ms=NOW_MS)
    assert len(req.headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(req.body, req.headers)
    Webhook(new).verify(req.body, req.headers)


def test_expired_secret_no_longer_signs() -> None:
    old, new = generate_secret(b"\x01" * 32), generate_secret(b"\x02" * 32)
    ep = _endpoint(
        SigningSecret("old", decode_secret(old), 0, NOW_MS - 1),
        SigningSecret("new", decode_secret(new), 0),
    )
    req = render(make_delivery(), ep, now_ms=NOW_MS)
    assert len(req.headers["webhook-signature"].split(" ")) == 1
    Webhook(new).verify(req.body, req.headers)
    with pytest.raises(Exception):  # noqa: B017 - the library's own verification error
        Webhook(old).verify(req.body, req.headers)


def test_render_without_active_secret_is_a_render_error() -> None:
    with pytest.raises(RenderError, match="no active signing secret"):
        render(make_delivery(), _endpoint(), now_ms=NOW_MS)


def test_unknown_provider_is_a_render_error() -> None:
    ep = _endpoint(SigningSecret("s", b"k" * 32, 0), provider="v9")
    with pytest.raises(RenderError, match="unknown provider"):
        render(make_delivery(), ep, now_ms=NOW_MS)


@pytest.mark.parametrize("bad", ["abc", "whsec_", "whsec_!!!notbase64", "whsec_c2hvcnQ="])
def test_malformed_secrets_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_secret(bad)


def test_verify_rejects_stale_timestamps_and_tampering() -> None:
    key = b"k" * 32
    sig = sign(key, "msg_1", 1000, b"body")
    assert verify(key, "msg_1", 1000, b"body", sig, now_s=1000)
    assert not verify(key, "msg_1", 1000, b"body!", sig, now_s=1000)
    assert not verify(key, "msg_1", 1000, b"body", sig, now_s=1000 + 301)


@pytest.mark.parametrize("key_len", [1, 16, 32, 63, 64, 65, 100, 200])
def test_sign_is_hmac_sha256_for_every_key_length(key_len: int) -> None:
    import base64
    import hashlib
    import hmac as hmac_mod

    from postbacks.core.signing import sign

    key = bytes((7 * i + key_len) % 256 for i in range(key_len))
    for body in (b"", b"{}", bytes(range(256)) * 5):
        for _ in range(2):  # the second time from the cached key states
            want = hmac_mod.new(key, b"msg_x.1700000000." + body, hashlib.sha256).digest()
            got = sign(key, "msg_x", 1700000000, body)
            assert got == "v1," + base64.b64encode(want).decode()


def test_a_url_macro_too_long_is_a_render_error_and_a_long_body_is_cut_in_the_record() -> None:
    from postbacks.core.outcomes import STORED_BODY_BYTES, make_attempt
    from postbacks.core.render import MAX_URL_BYTES
    from tests.unit.factories import make_conversion

    ep = Endpoint("ep_1", "app_1", "https://example.test/cb?p={snapshot.p}", frozenset({"*"}),
                  provider="v2", secrets=(SigningSecret("s1", decode_secret(generate_secret()),
                                                        NOW_MS - 1000, None),))

    def with_p(n: int) -> object:
        return make_delivery(conversion=make_conversion(source_snapshot={"p": "/" * n}))

    assert len(render(with_p(1000), ep, now_ms=NOW_MS).url) < MAX_URL_BYTES  # type: ignore[arg-type]
    with pytest.raises(RenderError, match=r"rendered URL is .* over the 16,384"):
        render(with_p(333_160), ep, now_ms=NOW_MS)  # type: ignore[arg-type]
    from postbacks.core.render import RenderedRequest

    req = RenderedRequest("POST", "https://example.test/" + "u" * 20_000,
                          {"x-long": "h" * 20_000}, b"x" * 900_000)
    rec = make_attempt(make_delivery(), now_ms=NOW_MS, result="delivered", req=req)
    assert len(rec["request_url"]) < 8300 and rec["request_url"].endswith(" characters]")
    assert len(rec["request_headers"]["x-long"]) < 8300
    stored = rec["request_body"] or b""
    assert len(stored) < STORED_BODY_BYTES + 64 and stored.endswith(b" bytes]")
    assert stored.startswith(req.body[:1000])
