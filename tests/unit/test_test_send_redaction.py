"""A test-send's response excerpt has every signature of the request redacted, wherever the
receiver echoes it: a partner provider's ``sha256=<hex>`` echoed bare (just the hex) too,
not only Standard Webhooks' ``v1,<base64>``."""

from __future__ import annotations

import pytest

from replay_console.endpoints import _redact


@pytest.mark.parametrize(("echoed", "sigs", "shown"), [
    ('{"received":"abab12cd"}', {"sha256=abab12cd"}, '{"received":"[redacted]"}'),
    ("sig sha256=abab12cd ok", {"sha256=abab12cd"}, "sig sha256=[redacted] ok"),
    ("v1,QUJD== and QUJD==", {"v1,QUJD=="}, "v1,[redacted] and [redacted]"),
    ("bare QUJD== here", {"QUJD=="}, "bare [redacted] here"),  # padding is no scheme
    ("t=1700000000 echoed", {"t=1700000000,v1=ffee"}, "t=1700000000 echoed"),
])
def test_signatures_are_redacted_wherever_echoed(echoed: str, sigs: set[str],
                                                 shown: str) -> None:
    assert _redact(echoed, sigs) == shown
