"""The HTTP/1.1 request encoder of :mod:`postbacks.transport.h1`: one request's bytes, with
nothing in them that could split it into two."""

from __future__ import annotations

from postbacks import __version__
from postbacks.core.providers.base import CLIENT_HEADERS

__all__ = ["USER_AGENT", "InvalidRequest", "encode_request"]

USER_AGENT = f"postbacks/{__version__}"
# Set by this client from its arguments; a caller's copy is dropped.
_OWN_HEADERS = CLIENT_HEADERS


class InvalidRequest(ValueError):
    """The request text would not be a single, well-formed HTTP request."""


def encode_request(
    method: str, target: str, host: str, headers: dict[str, str], body: bytes | None,
    user_agent: str = USER_AGENT,
) -> bytes:
    """The request bytes: ``Host``, the caller's headers (minus those this client owns),
    ``User-Agent`` unless given, ``Content-Length`` when there is a body (or the method
    normally has one). Raises :class:`InvalidRequest` on CR/LF/NUL anywhere."""
    parts = [method, " ", target, " HTTP/1.1\r\nHost: ", host, "\r\n"]
    lines = 3  # request line, Host, the blank line
    agent = True
    for name, value in headers.items():
        lname = name.lower()
        if lname in _OWN_HEADERS:
            continue
        if lname == "user-agent":
            agent = False
        parts += (name, ": ", value, "\r\n")
        lines += 1
    if agent:
        parts += ("User-Agent: ", user_agent, "\r\n")
        lines += 1
    if body or (body is not None and method in ("POST", "PUT", "PATCH")):
        parts += ("Content-Length: ", str(len(body)), "\r\n")
        lines += 1
    parts.append("\r\n")
    head = "".join(parts)
    # Every CR and LF must be one written here: no request splitting through any text.
    if (head.count("\n") != lines or head.count("\r") != lines or "\x00" in head
            or not method.isalpha() or " " in target or not target):
        raise InvalidRequest(f"refusing to send a malformed request to {host!r}")
    data = head.encode("utf-8")
    return data + body if body else data
