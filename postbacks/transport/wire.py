"""The wire under :class:`~postbacks.transport.http.HttpTransport`: which HTTP client sends
the vetted request (``POSTBACKS_HTTP_CLIENT``; docs/decisions/0001-http-client.md), opened
by :func:`postbacks.transport.clients.open_wire`.

* ``h1`` (default): :class:`~postbacks.transport.h1.H1Pool`, this package's own client;
* ``aiohttp``: :class:`~postbacks.transport.aiohttp_wire.AiohttpWire` (ClientSession);
* ``httpx``: :class:`~postbacks.transport.httpx_wire.HttpxWire` (AsyncClient).

Every wire takes the same arguments (a :class:`PoolKey` with a vetted address, the request
target, the ``Host`` value, headers, body), follows no redirect, keeps the first
``BODY_LIMIT`` body bytes and only the ``Retry-After`` and ``Location`` headers, sets no
timeout of its own (HttpTransport's deadlines cancel the exchange) except
``connect_timeout_s`` on opening a connection (past it: :class:`ConnectError`), and raises
what HttpTransport maps: :class:`ConnectError` (could not connect, TLS included),
:class:`InvalidRequest` (CR, LF or NUL in the request text), ``TimeoutError``, or another
``OSError`` (connection lost, malformed response).
"""

from __future__ import annotations

from typing import Protocol

from postbacks.core.providers.base import CLIENT_HEADERS
from postbacks.transport.h1 import (
    BODY_LIMIT,
    DISCARD_LIMIT,
    USER_AGENT,
    H1Response,
    InvalidRequest,
    PoolKey,
)

__all__ = ["BODY_LIMIT", "CLIENTS", "DISCARD_LIMIT", "OWN_HEADERS", "WANTED_HEADERS", "Wire",
           "checked_headers", "origin"]

CLIENTS = ("h1", "aiohttp", "httpx")

# Set by the wire from its arguments; a caller's copy is dropped (as h1 does).
OWN_HEADERS = CLIENT_HEADERS
WANTED_HEADERS = ("retry-after", "location")


class Wire(Protocol):
    async def request(
        self, key: PoolKey, method: str, target: str, host: str, headers: dict[str, str],
        body: bytes | None = None, *, connect_timeout_s: float | None = None,
    ) -> H1Response: ...

    async def close(self) -> None: ...


def checked_headers(method: str, target: str, host: str,
                    headers: dict[str, str]) -> dict[str, str]:
    """``Host``, then the caller's headers minus those the wire owns, with ``User-Agent``
    unless given. Raises :class:`InvalidRequest` on CR, LF or NUL anywhere (the libraries
    refuse some of these themselves, each with its own error)."""
    out = {"Host": host}
    agent = True
    for name, value in headers.items():
        lname = name.lower()
        if lname in OWN_HEADERS:
            continue
        if lname == "user-agent":
            agent = False
        out[name] = value
    if agent:
        out["User-Agent"] = USER_AGENT
    text = "".join((target, *out, *out.values()))
    if ("\r" in text or "\n" in text or "\x00" in text or not method.isalpha()
            or " " in target or not target):
        raise InvalidRequest(f"refusing to send a malformed request to {host!r}")
    return out


def origin(key: PoolKey) -> str:
    """``scheme://address:port`` of ``key`` (an IPv6 address in brackets)."""
    ip = f"[{key.ip}]" if ":" in key.ip else key.ip
    return f"{key.scheme}://{ip}:{key.port}"

