"""SSRF address policy: which resolved addresses a postback may connect to.

Only globally routable unicast addresses pass. Loopback passes only when the operator set
``POSTBACKS_ALLOW_LOOPBACK_TARGETS`` (tests, local demo); private, link-local (including
cloud metadata 169.254.169.254), CGNAT, multicast, reserved and unspecified ranges never
do. IPv4-mapped and 6to4/Teredo-embedded IPv6 forms are judged by the IPv4 inside.
"""

from __future__ import annotations

import ipaddress

__all__ = ["blocked_reason"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in ipaddress.IPv6Network("64:ff9b::/96"):  # NAT64
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def blocked_reason(address: str, *, allow_loopback: bool = False) -> str | None:
    """None if ``address`` (a literal IP) may be connected to, else why not."""
    try:
        ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return f"not an IP address: {address!r}"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_v4(ip)
        if inner is not None:
            return blocked_reason(str(inner), allow_loopback=allow_loopback)
    if ip.is_loopback:
        return None if allow_loopback else "loopback address"
    if ip.is_unspecified:
        return "unspecified address"
    if ip.is_multicast:
        return "multicast address"
    if ip.is_link_local:
        return "link-local address (cloud metadata range)"
    if ip.is_private:
        return "private address"
    if ip.is_reserved:
        return "reserved address"
    if not ip.is_global:
        return "non-global address"
    return None
