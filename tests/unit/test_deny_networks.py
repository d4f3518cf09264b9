"""Operators add the networks their deployment must never post to
(``POSTBACKS_DENY_NETWORKS``): a cloud's platform address that is public was allowed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from postbacks.core.ssrf import blocked_reason, deny_networks, url_blocked_reason
from postbacks.errors import ConfigError
from postbacks.settings import load_settings


@pytest.fixture
def denied() -> Iterator[None]:
    deny_networks("168.63.129.16, 203.1.0.0/16, 2a01:111::/32, 127.0.0.2/32")
    yield
    deny_networks("")


def test_denied_networks_are_refused_and_others_still_allowed(denied: None) -> None:
    why = "address denied by POSTBACKS_DENY_NETWORKS"
    assert blocked_reason("168.63.129.16") == why
    assert blocked_reason("203.1.200.7") == why
    assert blocked_reason("2a01:111::5") == why
    assert blocked_reason("::ffff:168.63.129.16") == why  # the IPv4 inside, too
    assert blocked_reason("127.0.0.2", allow_loopback=True) == why  # before the allowance
    assert blocked_reason("127.0.0.1", allow_loopback=True) is None
    assert blocked_reason("8.8.8.8") is None
    assert url_blocked_reason("http://168.63.129.16/x", allow_loopback=False) == (
        f"168.63.129.16 (168.63.129.16): {why}")


def test_nothing_is_denied_beyond_the_built_in_ranges_by_default() -> None:
    assert blocked_reason("168.63.129.16") is None


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "example.com", "1.2.3.4, nope"])
def test_a_bad_network_is_refused_at_start_naming_it(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"POSTBACKS_DENY_NETWORKS: '.*' is not an IP"):
        load_settings({"POSTBACKS_DENY_NETWORKS": bad})
