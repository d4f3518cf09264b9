"""An edit-and-replay is judged by the console when it is queued; the agent sends it later,
with the endpoint's config as it is then. A custom header (an API key) added after a
reviewer queued a replay to their own host went to that host. When the copy is sent, the
endpoint's custom headers go only where the console would have let them go."""

from __future__ import annotations

import pytest

from postbacks.core.endpoint import Endpoint, EndpointConfig
from postbacks.core.override import Override, apply_override, headers_may_go

EP = Endpoint("ep_1", "app_1", "https://hooks.pub.example/in", frozenset({"*"}),
              config=EndpointConfig(headers={"X-Api-Key": "k-123456"},
                                    test_hosts=("staging.pub.example",)))


@pytest.mark.parametrize(("url", "by", "go"), [
    ("https://hooks.pub.example/in?x=1", "support:alice", True),  # its own URL
    ("https://HOOKS.pub.example.:443/in", "support:alice", True),
    # another path or port of its host may be another tenant's: admins only
    ("https://hooks.pub.example/other", "support:alice", False),
    ("https://hooks.pub.example/in/", "reviewer:carol", False),
    ("https://hooks.pub.example:8443/in", "support:alice", False),
    ("https://hooks.pub.example/other", "admin:dana", True),
    ("https://hooks.pub.example/i%6e", "support:alice", False),  # (another path to us)
])
def test_where_custom_headers_may_go(url: str, by: str | None, go: bool) -> None:
    assert headers_may_go(EP, url, by) is go
    sent = apply_override(EP, Override(url=url), by=by)
    assert sent.url == url
    assert dict(sent.config.headers) == ({"X-Api-Key": "k-123456"} if go else {})


PLAIN = Endpoint("ep_2", "app_1", "http://hooks.pub.example/in%2fx", frozenset({"*"}),
                 config=EndpointConfig(headers={"X-Api-Key": "k-123456"}))


@pytest.mark.parametrize(("url", "go"), [
    ("https://hooks.pub.example/in%2Fx", True),  # the same URL over TLS, escapes' case aside
    ("https://hooks.pub.example:443/in%2fx", True),
    ("https://hooks.pub.example:8443/in%2fx", False),
    ("http://hooks.pub.example:8080/in%2fx", False),
])
def test_the_same_url_over_tls_is_the_endpoint(url: str, go: bool) -> None:
    assert headers_may_go(PLAIN, url, "support:alice") is go


@pytest.mark.parametrize(("url", "by", "go"), [
    ("https://hooks.pub.example/in", "support:alice", True),
    ("https://staging.pub.example/in", "support:cli:bob", True),  # a test host
    ("https://reviewer.example/h", "reviewer:carol", False),  # another host: admins only
    ("https://reviewer.example/h", "admin:dana", True),
    ("https://reviewer.example/h", None, False),
    ("http://hooks.pub.example/in", "admin:dana", False),  # never in clear from https
    ("ftp://hooks.pub.example/in", "admin:dana", False),
])
def test_where_custom_headers_may_go_besides(url: str, by: str | None, go: bool) -> None:
    assert headers_may_go(EP, url, by) is go
    sent = apply_override(EP, Override(url=url), by=by)
    assert sent.url == url
    assert dict(sent.config.headers) == ({"X-Api-Key": "k-123456"} if go else {})


def test_a_copy_not_retargeted_keeps_its_headers() -> None:
    sent = apply_override(EP, Override(fields=("conversion_id",)), by="support:alice")
    assert dict(sent.config.headers) == {"X-Api-Key": "k-123456"}
    assert apply_override(EP, None) is EP
