"""Who is asking, and may they: console tokens, roles, sessions, CSRF.

- **Tokens** (``postbacks console token create``) are random, shown once, stored as a
  sha256 hash with a name (the audit actor), a role and, for publishers, their apps.
- **Roles**: ``support`` (find, inspect, replay, suppress, resolve dead letters,
  test-send), ``reviewer`` (support's rights plus the only role that may release or
  reject held deliveries), ``admin`` (everything, incl. endpoint config and secrets),
  ``publisher`` (read its own apps' deliveries; held and rejected ones never appear —
  enforced in the SQL of :mod:`replay_console.queries`).
- **Sessions**: signing in with a token sets a cookie ``<token_id>.<expires>.<hmac>``;
  each request re-checks the token is not revoked. API clients may instead send
  ``Authorization: Bearer <token>``.
- **CSRF**: every state-changing request authenticated by the cookie must carry
  ``csrf`` (form field or ``X-CSRF-Token`` header) = HMAC(session cookie); bearer-token
  requests carry no ambient credential and need none.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.ids import new_id

__all__ = [
    "ROLES",
    "Principal",
    "Unauthorized",
    "create_token",
    "csrf_for",
    "lookup_session",
    "lookup_token",
    "may",
    "session_cookie",
]

ROLES = ("support", "reviewer", "admin", "publisher")
SESSION_S = 8 * 3600

# What each role may do (actions checked by the web handlers and the CLI alike).
_RIGHTS: dict[str, frozenset[str]] = {
    "publisher": frozenset({"read"}),
    "support": frozenset({"read", "read_internal", "replay", "suppress", "test_send"}),
    "reviewer": frozenset({"read", "read_internal", "replay", "suppress", "test_send",
                           "resolve_held"}),
    "admin": frozenset({"read", "read_internal", "replay", "suppress", "test_send",
                        "resolve_held", "edit_endpoint", "unlimited_replay"}),
}


class Unauthorized(Exception):
    """No valid credential (401) — distinct from a valid one lacking a right (403)."""


@dataclass(frozen=True, slots=True)
class Principal:
    token_id: str
    name: str
    role: str
    app_ids: tuple[str, ...]

    @property
    def is_publisher(self) -> bool:
        return self.role == "publisher"

    @property
    def actor(self) -> str:
        return f"{self.role}:{self.name}"


def may(p: Principal, right: str) -> bool:
    return right in _RIGHTS.get(p.role, frozenset())


def _bytes(text: str) -> bytes:
    """Any str as bytes, lone surrogates too (a header that was not UTF-8)."""
    return text.encode("utf-8", "surrogatepass")


def _hash(token: str) -> bytes:
    return hashlib.sha256(_bytes(token)).digest()


def create_token(conn: psycopg.Connection[Any], *, name: str, role: str,
                 app_ids: Sequence[str] = (), created_by: str) -> tuple[str, str]:
    """A new token: ``(token_id, token)``; the token is not stored and cannot be shown
    again. Raises ValueError on a bad role, name or app list."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    if not name.strip():
        raise ValueError("name must name a person or a team")
    if role == "publisher" and not app_ids:
        raise ValueError("a publisher token needs at least one app id")
    if role != "publisher" and app_ids:
        raise ValueError("only publisher tokens are scoped to apps")
    token_id = new_id("tok", int(time.time() * 1000))
    token = "pbc_" + secrets.token_urlsafe(32)
    conn.execute(
        "INSERT INTO console_tokens (token_id, token_hash, name, role, app_ids, created_by)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (token_id, _hash(token), name.strip(), role, list(app_ids), created_by),
    )
    conn.execute(
        "INSERT INTO audit_log (actor, action, target_type, target_id, after)"
        " VALUES (%s, 'console.token_create', 'console_token', %s, %s)",
        (created_by, token_id, Jsonb(
            {"name": name.strip(), "role": role, "app_ids": list(app_ids)})),
    )
    return token_id, token


def _principal(row: Sequence[Any] | None) -> Principal | None:
    if row is None:
        return None
    return Principal(row[0], row[1], row[2], tuple(row[3]))


def lookup_token(conn: psycopg.Connection[Any], token: str) -> Principal | None:
    row = conn.execute(
        "SELECT token_id, name, role, app_ids FROM console_tokens"
        " WHERE token_hash = %s AND revoked_at IS NULL", (_hash(token.strip()),),
    ).fetchone()
    return _principal(row)


def _sig(key: bytes, message: str) -> str:
    return hmac.new(key, _bytes(message), hashlib.sha256).hexdigest()[:40]


def session_cookie(key: bytes, token_id: str, *, now_s: float | None = None) -> str:
    expires = int((now_s if now_s is not None else time.time()) + SESSION_S)
    body = f"{token_id}.{expires}"
    return f"{body}.{_sig(key, 'session|' + body)}"


def lookup_session(conn: psycopg.Connection[Any], key: bytes, cookie: str,
                   *, now_s: float | None = None) -> Principal | None:
    parts = cookie.split(".")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    body = f"{parts[0]}.{parts[1]}"
    if not hmac.compare_digest(_bytes(parts[2]), _sig(key, "session|" + body).encode()):
        return None
    if int(parts[1]) < (now_s if now_s is not None else time.time()):
        return None
    row = conn.execute(
        "SELECT token_id, name, role, app_ids FROM console_tokens"
        " WHERE token_id = %s AND revoked_at IS NULL", (parts[0],),
    ).fetchone()
    return _principal(row)


def csrf_for(key: bytes, cookie: str) -> str:
    return _sig(key, "csrf|" + cookie)


def check_csrf(key: bytes, cookie: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(csrf_for(key, cookie).encode(),
                                               _bytes(given or ""))
