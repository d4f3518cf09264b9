from __future__ import annotations

import pytest

from postbacks.core.ssrf import blocked_reason


@pytest.mark.parametrize(
    "address",
    ["10.0.0.1", "172.16.5.4", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
     "224.0.0.1", "240.0.0.1", "255.255.255.255", "::", "fe80::1", "fc00::1", "ff02::1",
     "::ffff:10.0.0.1", "::ffff:169.254.169.254", "::ffff:127.0.0.1", "2002:a00:1::",
     "64:ff9b::a00:1", "127.0.0.1", "::1", "127.1.2.3"],
)
def test_internal_addresses_are_blocked(address: str) -> None:
    assert blocked_reason(address) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert blocked_reason(address) is None


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "::ffff:127.0.0.1"])
def test_loopback_only_by_explicit_setting(address: str) -> None:
    assert blocked_reason(address, allow_loopback=True) is None
    assert blocked_reason("10.0.0.1", allow_loopback=True) is not None


def test_non_ip_is_refused() -> None:
    assert blocked_reason("example.com") is not None
