"""A postback URL as it goes on the wire: the one parse that the HTTP client sends and the
``v2`` signature covers, so the two can never differ.

yarl, asked to parse a URL, normalizes it: it removes dot-segments (``/cb/%2E%2E/ok`` is
sent as ``/ok``), and decodes ``%2F``, ``%3B`` and ``%26`` where it considers them safe. A
rendered URL whose every character is one a URL may hold, with every ``%`` starting an
escape, is therefore taken as already encoded and sent byte for byte. Anything else (a
space, a non-ASCII letter, a stray ``%`` in an endpoint's own literal text) is encoded by
yarl first, as before.
"""

from __future__ import annotations

import functools
import re

from yarl import URL

__all__ = ["as_sent", "request_target"]

# RFC 3986, after the host: unreserved, the delimiters a path and query may hold as they
# are, and percent-escapes. Not "[" and "]": yarl escaped them there, and strict servers
# (Tomcat) refuse them bare. The authority (an IPv6 host is in brackets) is ASCII.
_ENCODED = re.compile(r"(?:[A-Za-z0-9\-._~:/?#@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")
_AUTHORITY = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[A-Za-z0-9\-._~:@!$&'()*+,;=%\[\]]*")


@functools.lru_cache(maxsize=4096)
def _parse(url: str) -> URL:
    head = _AUTHORITY.match(url)
    if head is not None and _ENCODED.fullmatch(url, head.end()):
        return URL(url, encoded=True)
    return URL(url)


def as_sent(url: str) -> URL:
    """``url`` parsed as the HTTP client sends it (see the module's doc)."""
    if len(url) > 2048:  # a long v2 postback: not worth a cache slot
        return _parse.__wrapped__(url)
    return _parse(url)


def request_target(url: str) -> str:
    """The request target sent for ``url``: its path and query, exactly as on the request
    line (``/`` for an empty path)."""
    return as_sent(url).raw_path_qs or "/"
