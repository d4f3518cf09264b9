"""Sending one rendered request, with the SSRF guard in the resolver.

aiohttp was chosen by measurement (see README "Performance"): on this class of machine it
sustains ~9,000 keep-alive POST/s per core where httpx's AsyncClient managed ~700.

The connector resolves every host through :class:`VettingResolver`, which drops any
address the SSRF policy refuses; aiohttp then connects to exactly the vetted addresses it
was handed, so there is no window for DNS rebinding between check and connect. Redirects
are not followed. aiohttp's exceptions are translated to :class:`HttpResult` here.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from postbacks.core.classify import HttpResult
from postbacks.core.render import RenderedRequest
from postbacks.core.ssrf import blocked_reason

__all__ = ["BlockedAddress", "HttpTransport", "SendResult", "VettingResolver"]

EXCERPT_BYTES = 256


class BlockedAddress(OSError):
    """Every address of the host is refused by the SSRF policy."""


class VettingResolver(AbstractResolver):
    def __init__(self, allow_loopback: bool) -> None:
        self._inner = DefaultResolver()
        self._allow_loopback = allow_loopback

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        vetted = [
            r for r in results
            if blocked_reason(r["host"], allow_loopback=self._allow_loopback) is None
        ]
        if not vetted:
            reasons = {blocked_reason(r["host"], allow_loopback=self._allow_loopback)
                       for r in results}
            raise BlockedAddress(f"{host}: refused ({', '.join(sorted(map(str, reasons)))})")
        return vetted

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True, slots=True)
class SendResult:
    http: HttpResult
    wire_ms: float
    excerpt: bytes | None
    blocked: str | None = None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # HTTP-date form: treated as absent (the schedule applies)


class HttpTransport:
    def __init__(self, *, timeout_s: float, allow_loopback: bool, limit: int = 512) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._allow_loopback = allow_loopback
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpTransport:
        connector = aiohttp.TCPConnector(
            limit=self._limit, limit_per_host=0, ttl_dns_cache=30,
            resolver=VettingResolver(self._allow_loopback),
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, req: RenderedRequest) -> SendResult:
        assert self._session is not None, "use `async with HttpTransport(...)`"
        start = time.perf_counter()
        try:
            async with self._session.request(
                req.method, req.url, data=req.body, headers=req.headers, allow_redirects=False
            ) as resp:
                excerpt = await resp.content.read(EXCERPT_BYTES)
                status = resp.status
                retry_after = _retry_after(resp.headers.get("Retry-After"))
        except BlockedAddress as exc:
            return SendResult(HttpResult(None, "blocked_address"), _ms(start), None, str(exc))
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, BlockedAddress):
                return SendResult(
                    HttpResult(None, "blocked_address"), _ms(start), None, str(exc.os_error)
                )
            return SendResult(HttpResult(None, "connection_error"), _ms(start), None)
        except TimeoutError:
            return SendResult(HttpResult(None, "timeout"), _ms(start), None)
        except (aiohttp.ClientError, OSError):
            return SendResult(HttpResult(None, "connection_error"), _ms(start), None)
        return SendResult(HttpResult(status, None, retry_after), _ms(start), excerpt)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
