"""The request target the HTTP client sends for a URL (every provider's), and the one a v2
signature covers: an encoded URL byte for byte, anything else encoded by yarl as before."""

from __future__ import annotations

import pytest

from postbacks.core.targets import as_sent, request_target


@pytest.mark.parametrize(("url", "target"), [
    # already encoded: byte for byte (yarl resolved the dots and decoded %3B, %26, %2F)
    ("https://h/cb/%2E%2E/ok?x=%26&y=a%2Fb", "/cb/%2E%2E/ok?x=%26&y=a%2Fb"),
    ("https://h/a%3Bb", "/a%3Bb"),
    ("http://[::1]:8080/a/%2E%2E/b", "/a/%2E%2E/b"),  # an IPv6 host's brackets are fine
    ("https://h?x=1", "/?x=1"),
    ("https://h", "/"),
    # brackets after the host are escaped, as yarl always did (strict servers refuse them)
    ("https://h/a?sub[id]=1", "/a?sub%5Bid%5D=1"),
    # not URL text: encoded by yarl, as before
    ("https://h/a b?q=ü", "/a%20b?q=%C3%BC"),
    ("https://h/p?d=50%off", "/p?d=50%25off"),
])
def test_the_target_sent(url: str, target: str) -> None:
    assert request_target(url) == target
    assert (as_sent(url).raw_path_qs or "/") == target


def test_the_host_is_read_either_way() -> None:
    assert as_sent("https://xn--bcher-kva.example:8443/x").host == "bücher.example"
    assert as_sent("https://bücher.example/x").raw_host == "xn--bcher-kva.example"
    assert as_sent("http://[::1]:8080/x").raw_host == "::1"
