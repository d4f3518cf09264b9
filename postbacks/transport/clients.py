"""The wire named by ``POSTBACKS_HTTP_CLIENT`` (see :mod:`postbacks.transport.wire`)."""

from __future__ import annotations

from postbacks.transport.h1 import H1Pool
from postbacks.transport.wire import CLIENTS, Wire

__all__ = ["open_wire"]


def open_wire(client: str, *, limit: int, idle_timeout_s: float) -> Wire:
    """The wire named ``client`` (one of :data:`CLIENTS`), ``limit`` connections at most."""
    if client == "h1":
        return H1Pool(max_per_key=limit, max_total=limit, idle_timeout_s=idle_timeout_s)
    if client == "aiohttp":
        from postbacks.transport.aiohttp_wire import AiohttpWire

        return AiohttpWire(limit=limit, idle_timeout_s=idle_timeout_s)
    if client == "httpx":
        from postbacks.transport.httpx_wire import HttpxWire

        return HttpxWire(limit=limit, idle_timeout_s=idle_timeout_s)
    raise ValueError(f"unknown HTTP client {client!r}: expected one of {', '.join(CLIENTS)}")
