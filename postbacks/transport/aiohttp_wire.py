"""aiohttp's ClientSession as HttpTransport's wire (``POSTBACKS_HTTP_CLIENT=aiohttp``; see
:mod:`postbacks.transport.wire` for what every wire does).

One session, its connector holding at most ``limit`` connections (``limit`` per address as
well), keep-alive connections closed after ``idle_timeout_s``; no cookie jar, no
decompression, no redirects, no timeout of its own. aiohttp pools by (address, port, TLS,
server name): over plain http, unlike :class:`~postbacks.transport.h1.PoolKey`, two host
names on one address share connections.
"""

from __future__ import annotations

import aiohttp
from yarl import URL

from postbacks.transport.h1 import BODY_LIMIT, DISCARD_LIMIT, ConnectError, H1Response, PoolKey
from postbacks.transport.wire import WANTED_HEADERS, checked_headers, origin

__all__ = ["AiohttpWire"]

_SKIP = ("Accept", "Accept-Encoding", "Content-Type", "User-Agent")  # only the caller's


class AiohttpWire:
    def __init__(self, *, limit: int, idle_timeout_s: float) -> None:
        connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit,
                                         keepalive_timeout=idle_timeout_s, use_dns_cache=False)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=_SKIP,
            timeout=aiohttp.ClientTimeout(total=None), cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )

    async def request(
        self, key: PoolKey, method: str, target: str, host: str, headers: dict[str, str],
        body: bytes | None = None, *, connect_timeout_s: float | None = None,
    ) -> H1Response:
        sent = checked_headers(method, target, host, headers)
        url = URL(origin(key) + target, encoded=True)
        try:
            async with self._session.request(
                method, url, headers=sent, data=body, allow_redirects=False,
                server_hostname=key.server_hostname,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
            ) as resp:
                kept, size, truncated = await _read(resp)
                got = resp.headers
                wanted = {h: v.strip() for h in WANTED_HEADERS if (v := got.get(h)) is not None}
                return H1Response(resp.status, wanted, kept, size, truncated)
        except aiohttp.ClientConnectorError as exc:
            err = ConnectError(f"cannot connect to {key.ip}:{key.port}: {exc}")
            err.errno = exc.errno
            raise err from exc
        except aiohttp.ConnectionTimeoutError as exc:  # past connect_timeout_s
            raise ConnectError(f"cannot connect to {key.ip}:{key.port}: no answer within "
                               f"{connect_timeout_s} s") from exc
        except aiohttp.ClientError as exc:
            if isinstance(exc, TimeoutError):
                raise
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        await self._session.close()


async def _read(resp: aiohttp.ClientResponse) -> tuple[bytes, int, bool]:
    """The first ``BODY_LIMIT`` bytes of the body, its size, and whether it was cut off
    unread past ``DISCARD_LIMIT`` (the connection is then closed)."""
    length = resp.content_length
    if length is not None and length <= BODY_LIMIT:
        data = await resp.read()
        return data, len(data), False
    kept: list[bytes] = []
    room, size = BODY_LIMIT, 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if room > 0:
            piece = chunk[:room]
            kept.append(piece)
            room -= len(piece)
        if size > DISCARD_LIMIT:
            resp.close()
            return b"".join(kept), size, True
    return b"".join(kept), size, False

