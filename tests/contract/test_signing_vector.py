"""Freeze the signed content against the Standard Webhooks spec's published test vector."""

from __future__ import annotations

import base64

from standardwebhooks import Webhook

from postbacks.core.signing import decode_secret, sign

# From the Standard Webhooks specification / reference libraries' test suites.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
TIMESTAMP = 1614265330
PAYLOAD = b'{"test": 2432232314}'
EXPECTED = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_spec_vector() -> None:
    assert sign(decode_secret(SECRET), MSG_ID, TIMESTAMP, PAYLOAD) == EXPECTED


def test_reference_library_agrees() -> None:
    from datetime import UTC, datetime

    ref = Webhook(SECRET).sign(MSG_ID, datetime.fromtimestamp(TIMESTAMP, UTC), PAYLOAD.decode())
    assert ref == EXPECTED
    assert base64.b64decode(EXPECTED[3:])  # well-formed base64
