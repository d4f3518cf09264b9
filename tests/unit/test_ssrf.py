from __future__ import annotations

import ipaddress

import pytest

from postbacks.core.ssrf import (
    blocked_reason,
    host_blocked_reason,
    parse_host_literal,
    redirect_method,
    redirect_refused_reason,
    url_blocked_reason,
)


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


# --- every special-purpose range, refused even when loopback is allowed ------------------

@pytest.mark.parametrize(
    ("address", "range_name"),
    [
        ("0.1.2.3", "0.0.0.0/8"),
        ("100.127.255.254", "CGNAT 100.64/10"),
        ("192.0.0.9", "192.0.0.0/24"),
        ("192.0.0.170", "192.0.0.0/24"),
        ("198.18.0.1", "benchmarking 198.18/15"),
        ("198.19.255.254", "benchmarking 198.18/15"),
        ("192.0.2.1", "TEST-NET-1"),
        ("198.51.100.1", "TEST-NET-2"),
        ("203.0.113.1", "TEST-NET-3"),
        ("192.88.99.1", "6to4 relay anycast"),
        ("240.0.0.1", "240/4"),
        ("255.255.255.255", "broadcast"),
        ("169.254.0.1", "link-local"),
        ("fc00::1", "ULA fc00::/7"),
        ("fdff:ffff::1", "ULA fc00::/7"),
        ("fec0::1", "site-local fec0::/10"),
        ("feff::1", "site-local fec0::/10"),
        ("fe80::1%eth0", "link-local with zone"),
        ("febf::1", "link-local"),
        ("ff0e::1", "multicast"),
        ("2002:808:808::", "6to4 (public inside)"),
        ("2002:7f00:1::", "6to4 (loopback inside)"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
        ("64:ff9b::a9fe:a9fe", "NAT64 (metadata inside)"),
        ("64:ff9b::7f00:1", "NAT64 (loopback inside, judged as loopback)"),
        ("64:ff9b:1::808:808", "local-use NAT64 64:ff9b:1::/48"),
        ("100::1", "discard 100::/64"),
        ("2001:db8::1", "documentation 2001:db8::/32"),
        ("3fff::1", "documentation 3fff::/20"),
        ("::7f00:1", "IPv4-compatible ::/96"),
        ("::ffff:0:a00:1", "IPv4-translated"),
    ],
)
def test_special_purpose_ranges_are_blocked(address: str, range_name: str) -> None:
    assert blocked_reason(address) is not None, range_name
    if "loopback inside, judged" not in range_name:
        assert blocked_reason(address, allow_loopback=True) is not None, range_name


@pytest.mark.parametrize(
    "address", ["64:ff9b::808:808", "::ffff:8.8.8.8", "2001:4860:4860::8888", "9.9.9.9"]
)
def test_public_forms_pass(address: str) -> None:
    assert blocked_reason(address) is None


# --- parse_host_literal: every textual form of an address --------------------------------

LOOPBACK_FORMS = [
    "127.0.0.1", "2130706433", "0x7f000001", "0X7F000001", "0x7f.0.0.1", "0x7f.0x0.0x0.0x1",
    "0177.0.0.1", "0177.0000.0000.0001", "017700000001", "127.1", "127.0.1", "0x7f.1",
    "127.0.0.1.", "2130706433.", "[::1]", "::1", "[0:0:0:0:0:0:0:1]", "::ffff:127.0.0.1",
    "[::ffff:127.0.0.1]", "::ffff:7f00:1", "[::ffff:7f00:1]", "%31%32%37.0.0.1",
    "\uff11\uff12\uff17.\uff10.\uff10.\uff11", "127\u30020\u30020\u30021", "127.0.0.1 junk",
    "127.255.255.254", "[::ffff:127.1.2.3]",
]


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("10.1.1", "10.1.0.1"),
        ("10.257", "10.0.1.1"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("2852039166", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("4294967295", "255.255.255.255"),
        ("127.0.0.1.", "127.0.0.1"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1"),
        ("[fe80::1%25eth0]", "fe80::1"),
        ("%31%32%37.0.0.1", "127.0.0.1"),
        ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "127.0.0.1"),
        ("127.0.0.1 junk", "127.0.0.1"),
        ("8.8.8.8", "8.8.8.8"),
        ("134744072", "8.8.8.8"),
    ],
)
def test_parse_host_literal_forms(host: str, expected: str) -> None:
    assert parse_host_literal(host) == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "host",
    ["example.com", "localhost", "a.b.c", "1x.example", "0xfoo.example", "db-10.internal",
     "999.1.1.1", "256.0.0.1", "4294967296", "1.2.3.4.5", "09.1.1.1", "1..1", "[::1",
     "::ffff:0177.0.0.1", "", "xn--n3h.example"],
)
def test_parse_host_literal_refuses_to_guess(host: str) -> None:
    assert parse_host_literal(host) is None


@pytest.mark.parametrize("host", LOOPBACK_FORMS)
def test_loopback_forms_refused_unless_allowed(host: str) -> None:
    ip = parse_host_literal(host)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    assert ip is not None and (mapped or ip).is_loopback
    assert host_blocked_reason(host, allow_loopback=False) is not None
    assert host_blocked_reason(host, allow_loopback=True) is None


@pytest.mark.parametrize(
    "host",
    ["0xa9fea9fe", "2852039166", "0251.0376.0251.0376", "169.254.169.254.", "10.1", "012.1",
     "0x0a000001", "192.168.1", "0", "0.0.0.0", "[::]", "[fd00::1]", "[fe80::1%25eth0]",
     "[::ffff:a9fe:a9fe]", "::ffff:10.0.0.1", "[64:ff9b::a9fe:a9fe]"],
)
def test_internal_forms_refused_even_with_loopback_allowed(host: str) -> None:
    assert host_blocked_reason(host, allow_loopback=True) is not None


@pytest.mark.parametrize("host", ["999.1.1.1", "4294967296", "09.1.1.1", "a.0x1g", "[::1",
                                  "::ffff:0177.0.0.1", "1.2.3.4.5", "host:name"])
def test_numeric_looking_non_literals_are_refused(host: str) -> None:
    assert host_blocked_reason(host, allow_loopback=True) is not None


@pytest.mark.parametrize("host", ["8.8.8.8", "134744072", "0x08080808", "010.010.010.010",
                                  "[2606:4700:4700::1111]", "example.com", "api.example.com."])
def test_public_literals_and_hostnames_pass(host: str) -> None:
    assert host_blocked_reason(host, allow_loopback=False) is None


# --- url_blocked_reason ------------------------------------------------------------------

@pytest.mark.parametrize(
    "url",
    ["https://example.com/postback", "http://example.com:8080/p?x=1#f", "HTTPS://Example.COM/",
     "http://8.8.8.8/", "http://134744072/", "http://[2606:4700:4700::1111]:443/",
     "https://xn--n3h.example/"],
)
def test_urls_that_pass(url: str) -> None:
    assert url_blocked_reason(url, allow_loopback=False) is None


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "gopher://example.com:70/_x", "ftp://example.com/",
     "dict://example.com:11211/", "javascript:alert(1)", "data:text/plain,hi", "ws://x/",
     "//example.com/", "example.com/path", "http:///path", "http://", "http:/example.com",
     "http://:80/", "http://example.com:99999/", "http://example.com:0/", "http://[::1/"],
)
def test_bad_schemes_and_missing_hosts(url: str) -> None:
    assert url_blocked_reason(url, allow_loopback=True) is not None


@pytest.mark.parametrize(
    "url",
    ["http://evil@127.0.0.1/", "http://example.com@127.0.0.1/", "http://user:pw@example.com/",
     "http://8.8.8.8@169.254.169.254/", "http://a@b@example.com/",
     "http://127.0.0.1\\@example.com/", "http://example.com\\@127.0.0.1/",
     "http://exa mple.com/", "http://example.com/\n", "\x00http://example.com/"],
)
def test_userinfo_and_parser_differential_tricks(url: str) -> None:
    assert url_blocked_reason(url, allow_loopback=True) is not None


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::1]",
             "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "127.0.0.1.", "%31%32%37.0.0.1"],
)
def test_loopback_urls_only_when_allowed(host: str) -> None:
    url = f"http://{host}:8080/cb"
    assert url_blocked_reason(url, allow_loopback=False) is not None
    assert url_blocked_reason(url, allow_loopback=True) is None


@pytest.mark.parametrize(
    "url",
    ["http://169.254.169.254/latest/meta-data", "http://0xa9fea9fe/", "http://2852039166/",
     "http://0251.0376.0251.0376/", "http://10.0.0.1/", "http://10.1/", "http://0/",
     "http://[fe80::1%25eth0]/", "http://[::ffff:a9fe:a9fe]/", "https://192.168.0.1:8443/",
     "http://999.0.0.1/"],
)
def test_internal_urls_refused_even_with_loopback_allowed(url: str) -> None:
    assert url_blocked_reason(url, allow_loopback=True) is not None


# --- redirect policy ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("status", "method", "expected"),
    [
        (301, "POST", ("GET", False)),
        (302, "POST", ("GET", False)),
        (303, "POST", ("GET", False)),
        (303, "PUT", ("GET", False)),
        (303, "HEAD", ("HEAD", True)),
        (301, "PUT", ("PUT", True)),
        (302, "GET", ("GET", True)),
        (307, "POST", ("POST", True)),
        (308, "POST", ("POST", True)),
        (307, "GET", ("GET", True)),
    ],
)
def test_redirect_method(status: int, method: str, expected: tuple[str, bool]) -> None:
    assert redirect_method(status, method) == expected


@pytest.mark.parametrize(
    ("before", "after", "refused"),
    [
        ("https://a.example/x", "http://a.example/y", True),
        ("https://a.example/x", "http://b.example/y", True),
        ("https://a.example/x", "https://b.example/y", False),
        ("http://a.example/x", "https://a.example/y", False),
        ("http://a.example/x", "http://b.example/y", False),
    ],
)
def test_redirect_downgrade_is_refused(before: str, after: str, refused: bool) -> None:
    assert (redirect_refused_reason(before, after) is not None) is refused
