"""httpx's AsyncClient as HttpTransport's wire (``POSTBACKS_HTTP_CLIENT=httpx``; see
:mod:`postbacks.transport.wire` for what every wire does).

httpx pools connections by origin (scheme, address, port) alone, not by TLS server name,
so there is one client per TLS name (one for plain http): a connection verified for one
name never carries a request for another. Each client holds at most ``limit``
connections, closes keep-alive connections after ``idle_timeout_s``, keeps no cookies,
follows no redirects, reads the body undecoded and has no timeout of its own; its
per-request INFO log lines are turned off.
"""

from __future__ import annotations

import logging
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

from postbacks.transport.h1 import (
    BODY_LIMIT,
    DISCARD_LIMIT,
    ConnectError,
    H1Response,
    InvalidRequest,
    PoolKey,
)
from postbacks.transport.wire import WANTED_HEADERS, checked_headers, origin

__all__ = ["HttpxWire"]


class HttpxWire:
    def __init__(self, *, limit: int, idle_timeout_s: float) -> None:
        self._limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit,
                                    keepalive_expiry=idle_timeout_s)
        self._clients: dict[str | None, httpx.AsyncClient] = {}
        # httpx logs every request at INFO, the stages' default level: one log line per
        # delivery.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    def _client(self, tls_name: str | None) -> httpx.AsyncClient:
        client = self._clients.get(tls_name)
        if client is None:
            client = httpx.AsyncClient(
                limits=self._limits, timeout=httpx.Timeout(None), follow_redirects=False,
                trust_env=False, cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[])),
            )
            for name in ("Accept", "Accept-Encoding"):  # send only the caller's
                del client.headers[name]
            self._clients[tls_name] = client
        return client

    async def request(
        self, key: PoolKey, method: str, target: str, host: str, headers: dict[str, str],
        body: bytes | None = None, *, connect_timeout_s: float | None = None,
    ) -> H1Response:
        sent = checked_headers(method, target, host, headers)
        client = self._client(key.server_hostname)
        try:
            req = client.build_request(
                # values as UTF-8 bytes, as h1 and aiohttp send them (httpx would encode a
                # str as ASCII and refuse any other letter)
                method, origin(key) + target,
                headers={k.encode(): v.encode() for k, v in sent.items()}, content=body,
                timeout=httpx.Timeout(None, connect=connect_timeout_s),
                extensions={"sni_hostname": key.server_hostname} if key.server_hostname else None,
            )
            resp = await client.send(req, stream=True)
            try:
                kept: list[bytes] = []
                room, size, truncated = BODY_LIMIT, 0, False
                async for chunk in resp.aiter_raw():
                    size += len(chunk)
                    if room > 0:
                        piece = chunk[:room]
                        kept.append(piece)
                        room -= len(piece)
                    if size > DISCARD_LIMIT:
                        truncated = True  # closed unread below
                        break
            finally:
                await resp.aclose()
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, httpx.LocalProtocolError) as exc:
            raise InvalidRequest(f"refusing to send a malformed request to {host!r}: {exc}"
                                 ) from exc
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ConnectError(f"cannot connect to {key.ip}:{key.port}: {str(exc) or 'no answer'}"
                               ) from exc
        except httpx.TimeoutException as exc:
            raise TimeoutError(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise ConnectionError(f"{type(exc).__name__}: {exc}") from exc
        got = resp.headers
        wanted = {h: v.strip() for h in WANTED_HEADERS if (v := got.get(h)) is not None}
        return H1Response(resp.status_code, wanted, b"".join(kept), size, truncated)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()
