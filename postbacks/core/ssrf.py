"""SSRF policy: which URLs and addresses a postback may reach.

Only globally routable unicast addresses pass. Loopback passes only when the operator set
``POSTBACKS_ALLOW_LOOPBACK_TARGETS`` (tests, local demo); private, link-local (including
cloud metadata 169.254.169.254), CGNAT, multicast, documentation, benchmarking, reserved
and unspecified ranges never do. IPv4-mapped and NAT64 (64:ff9b::/96) forms are judged by
the IPv4 inside, so DNS64 networks keep working; 6to4, Teredo and local-use NAT64
(64:ff9b:1::/48) are refused outright (deprecated or site-specific translation: no
publisher needs them, and the target behind them cannot be judged).

A host is an IP literal in *every* form a C resolver (``inet_aton``) or a browser accepts:
``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``, ``[::ffff:7f00:1]``, a zone id, a
trailing dot, percent-encoded or full-width digits. Clients connect to such hosts without
asking DNS, so the literal must be judged here; a host that looks numeric but is not a
valid literal is refused rather than guessed at. Hostnames are left to the resolver, which
vets every address it returns (see ``postbacks.transport.http``). Pure: no DNS, no I/O.

Redirect policy lives here too: which method a hop uses and which hops are refused.
"""

from __future__ import annotations

import ipaddress
import unicodedata
from urllib.parse import unquote, urlsplit

__all__ = [
    "ALLOWED_SCHEMES",
    "REDIRECT_STATUSES",
    "IPAddress",
    "blocked_reason",
    "deny_networks",
    "host_blocked_reason",
    "parse_host_literal",
    "parse_networks",
    "redirect_method",
    "redirect_refused_reason",
    "url_blocked_reason",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOWED_SCHEMES = frozenset({"http", "https"})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

_NAT64_WKP = ipaddress.IPv6Network("64:ff9b::/96")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")

# Explicit deny lists: ``ipaddress``'s is_private/is_global tables differ between Python
# patch releases, so the ranges this policy depends on are spelled out.
_DENIED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = tuple(
    (ipaddress.IPv4Network(net), why) for net, why in (
        ("0.0.0.0/8", "unspecified/this-network address"),
        ("10.0.0.0/8", "private address"),
        ("100.64.0.0/10", "shared (CGNAT) address"),
        ("169.254.0.0/16", "link-local address (cloud metadata range)"),
        ("172.16.0.0/12", "private address"),
        ("192.0.0.0/24", "IETF protocol assignment address"),
        ("192.0.2.0/24", "documentation address"),
        ("192.88.99.0/24", "6to4 relay anycast address"),
        ("192.168.0.0/16", "private address"),
        ("198.18.0.0/15", "benchmarking address"),
        ("198.51.100.0/24", "documentation address"),
        ("203.0.113.0/24", "documentation address"),
        ("224.0.0.0/4", "multicast address"),
        ("240.0.0.0/4", "reserved address"),
    )
)
_DENIED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = tuple(
    (ipaddress.IPv6Network(net), why) for net, why in (
        ("64:ff9b:1::/48", "local-use NAT64 address"),  # before ::/8, which contains it
        ("::/8", "reserved address (IPv4-compatible, unspecified)"),
        ("100::/64", "discard-only address"),
        ("2001::/32", "Teredo address"),
        ("2001::/23", "IETF protocol assignment address"),
        ("2001:db8::/32", "documentation address"),
        ("2002::/16", "6to4 address"),
        ("3fff::/20", "documentation address"),
        ("5f00::/16", "SRv6 SID address"),
        ("fc00::/7", "unique local address"),
        ("fe80::/10", "link-local address"),
        ("fec0::/10", "site-local address"),
        ("ff00::/8", "multicast address"),
    )
)
# Dots that IDNA (UTS 46) maps to "." before a browser parses the host.
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64_WKP:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _listed(ip: IPAddress) -> str | None:
    if isinstance(ip, ipaddress.IPv4Address):
        return next((why for net, why in _DENIED_V4 if ip in net), None)
    return next((why for net, why in _DENIED_V6 if ip in net), None)


_DENIED_BY_OPERATOR: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


def parse_networks(cidrs: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated addresses or CIDRs; ValueError names the one that is neither."""
    out = []
    for part in filter(None, (p.strip() for p in cidrs.split(","))):
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(f"{part!r} is not an IP address or CIDR") from None
    return tuple(out)


def deny_networks(cidrs: str) -> None:
    """Refuse targets in these networks too (``POSTBACKS_DENY_NETWORKS``, set for the
    process by its command line): a cloud's platform addresses that are public (Azure's
    168.63.129.16), the deployment's own services on public addresses, anything that
    trusts the agent's address. Refused before the loopback allowance."""
    global _DENIED_BY_OPERATOR
    _DENIED_BY_OPERATOR = parse_networks(cidrs)


def blocked_reason(address: str, *, allow_loopback: bool = False) -> str | None:
    """None if ``address`` (a canonical IP literal) may be connected to, else why not."""
    try:
        ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"not an IP address: {address!r}"
    if _DENIED_BY_OPERATOR and any(ip in net for net in _DENIED_BY_OPERATOR):
        return "address denied by POSTBACKS_DENY_NETWORKS"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            return blocked_reason(str(inner), allow_loopback=allow_loopback)
    if ip.is_loopback:
        return None if allow_loopback else "loopback address"
    if ip.is_unspecified:
        return "unspecified address"
    if ip == _BROADCAST:
        return "broadcast address"
    listed = _listed(ip)
    if listed is not None:
        return listed
    if ip.is_multicast:
        return "multicast address"
    if ip.is_link_local:
        return "link-local address (cloud metadata range)"
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:
        return "site-local address"
    if ip.is_private:
        return "private address"
    if ip.is_reserved:
        return "reserved address"
    if not ip.is_global:
        return "non-global address"
    return None


def _normalise_host(host: str) -> str:
    """The host as a browser sees it before IP parsing: percent-decoded, NFKC, lower case."""
    h = unquote(host)
    if not h.isascii():
        h = unicodedata.normalize("NFKC", h).translate(_DOTS)
    return h.strip().lower()


def _number(part: str) -> int | None:
    """One inet_aton component: 0x-hex, 0-octal or decimal; None if it is not a number."""
    if part[:2] == "0x":
        digits = part[2:]
        if not all(c in "0123456789abcdef" for c in digits):
            return None
        return int(digits, 16) if digits else 0
    if not (part.isascii() and part.isdigit()):
        return None
    if len(part) > 1 and part[0] == "0":
        return int(part, 8) if all(c in "01234567" for c in part) else None
    return int(part)


def _parse_v4(host: str) -> ipaddress.IPv4Address | None:
    tokens = host.split(None, 1)  # glibc inet_aton stops at the first whitespace
    if not tokens:
        return None
    host = tokens[0]
    if host.endswith("."):
        host = host[:-1]
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or "" in parts:
        return None
    numbers = [_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    values = [n for n in numbers if n is not None]
    *head, last = values
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(values)):
        return None
    value = last
    for i, n in enumerate(head):
        value |= n << (8 * (3 - i))
    return ipaddress.IPv4Address(value)


def _parse_v6(host: str) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return None


def parse_host_literal(host: str) -> IPAddress | None:
    """The IP address ``host`` denotes in any textual form, or None for a real hostname.

    Accepts what inet_aton and the WHATWG URL parser accept: dotted decimal, one 32-bit
    number, hex and octal components, short forms (``127.1``, ``10.1.1``), bracketed
    IPv6, IPv4-mapped IPv6, zone ids (dropped), a trailing dot, percent-encoding and
    full-width characters. Out-of-range numeric forms are not literals (None): callers
    that must not guess use :func:`host_blocked_reason`.
    """
    h = _normalise_host(host)
    if not h:
        return None
    if h.startswith("[") or h.endswith("]"):
        return _parse_v6(h[1:-1]) if h.startswith("[") and h.endswith("]") else None
    if ":" in h:
        return _parse_v6(h)
    return _parse_v4(h)


def _looks_numeric(host: str) -> bool:
    """A host clients would treat as an IP (last label numeric, or a colon), not a name."""
    h = _normalise_host(host)
    if any(c in h for c in ":[]"):
        return True
    tokens = h.split()
    label = tokens[0].rstrip(".").rsplit(".", 1)[-1] if tokens else ""
    return (label.isascii() and label.isdigit()) or label[:2] == "0x"


def host_blocked_reason(host: str, *, allow_loopback: bool) -> str | None:
    """None if ``host`` is a hostname (the resolver vets it) or an allowed IP literal."""
    ip = parse_host_literal(host)
    if ip is None:
        return f"{host}: malformed IP literal" if _looks_numeric(host) else None
    reason = blocked_reason(str(ip), allow_loopback=allow_loopback)
    return None if reason is None else f"{host} ({ip}): {reason}"


def url_blocked_reason(url: str, *, allow_loopback: bool) -> str | None:
    """None if ``url`` may be requested before DNS is asked, else why not.

    Refuses schemes other than http/https, a missing or malformed host, any userinfo
    (``http://evil@127.0.0.1`` and friends exist to make parsers disagree), characters
    that parsers treat differently (backslash, whitespace, controls), and IP-literal hosts
    the address policy refuses.
    """
    if any(c.isspace() or ord(c) < 0x20 or c == "\x7f" for c in url):
        return "control or whitespace character in URL"
    if "\\" in url:
        return "backslash in URL"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"malformed URL: {exc}"
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        return f"scheme {scheme or '(none)'!r} not allowed"
    if "@" in parts.netloc:
        return "userinfo in URL not allowed"
    host = parts.hostname
    if not host:
        return "missing host"
    if port == 0:
        return "port 0 not allowed"
    return host_blocked_reason(host, allow_loopback=allow_loopback)


def redirect_method(status: int, method: str) -> tuple[str, bool]:
    """The method of the next hop and whether the body is kept, as browsers do.

    303 switches to GET (HEAD stays HEAD); 301/302 switch POST to GET; 307/308 keep both.
    """
    method = method.upper()
    if status == 303 and method != "HEAD":
        return "GET", False
    if status in (301, 302) and method == "POST":
        return "GET", False
    return method, True


def redirect_refused_reason(from_url: str, to_url: str) -> str | None:
    """Hop-level refusals that are not about the target address: a TLS downgrade."""
    before = urlsplit(from_url).scheme.lower()
    after = urlsplit(to_url).scheme.lower()
    if before == "https" and after != "https":
        return f"redirect_refused: {before} -> {after or '(none)'} downgrade"
    return None
