"""Who is asking, and may they: console tokens, roles, sessions, CSRF.

- **Tokens** (``postbacks console token create``) are random, shown once, stored as a
  sha256 hash with a name (the audit actor), a role and, for publishers, their apps. A
  token may expire (``expires_at``) and may be revoked (``postbacks console token
  revoke``); an expired or revoked token signs nothing in, and the sessions it opened end
  at their next request. ``last_used_at`` is updated at most once a minute.
- **Roles**: ``support`` (find, inspect, replay, suppress, resolve dead letters,
  test-send), ``reviewer`` (support's rights plus the only role that may release or
  reject held deliveries), ``admin`` (everything, incl. endpoint config and secrets),
  ``publisher`` (read its own apps' deliveries; held and rejected ones never appear —
  enforced in the SQL of :mod:`replay_console.queries`).
- **Sessions**: signing in sets a cookie ``<token_id>.<expires>.<nonce>.<hmac>``;
  each request re-checks the token is neither revoked nor expired, and the session was
  not signed out (:func:`end_session` records a signed-out cookie until its expiry). API
  clients may instead send ``Authorization: Bearer <token>``.
- **CSRF**: every state-changing request authenticated by the cookie must carry
  ``csrf`` (form field or ``X-CSRF-Token`` header) = HMAC(session cookie); bearer-token
  requests carry no ambient credential and need none.
- **Step-up** for an endpoint URL change: :func:`issue_step_up` gives a confirmation code
  signed with the session key and bound to the token, the endpoint and the new URL, valid
  :data:`STEP_UP_S` seconds; :func:`spend_step_up` accepts it once (the spent code's
  nonce is recorded in ``console_step_ups``).
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
    "CLI_PREFIX",
    "MAX_NAME",
    "ROLES",
    "STEP_UP_S",
    "Principal",
    "Unauthorized",
    "cli_principal",
    "create_token",
    "csrf_for",
    "end_session",
    "issue_step_up",
    "list_tokens",
    "lookup_session",
    "lookup_token",
    "may",
    "name_problem",
    "revoke_token",
    "session_cookie",
    "session_token_id",
    "spend_step_up",
]

ROLES = ("support", "reviewer", "admin", "publisher")
MAX_NAME = 100  # a token's name: the actor of its audit rows (the audit filter takes 200)
SESSION_S = 8 * 3600
STEP_UP_S = 300  # a URL-change confirmation is valid this long, once
# A token signs in while it is neither revoked nor past its expiry.
_LIVE = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())"

# What each role may do (actions checked by the web handlers and the CLI alike).
_RIGHTS: dict[str, frozenset[str]] = {
    "publisher": frozenset({"read"}),
    "support": frozenset({"read", "read_internal", "replay", "suppress", "test_send"}),
    "reviewer": frozenset({"read", "read_internal", "replay", "suppress", "test_send",
                           "resolve_held", "import"}),
    "admin": frozenset({"read", "read_internal", "replay", "suppress", "test_send",
                        "resolve_held", "import", "edit_endpoint", "unlimited_replay"}),
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


CLI_PREFIX = "cli:"  # a command's actor, <role>:cli:<--actor>: never a console token's


def name_problem(name: str, what: str) -> str | None:
    """Why ``name`` cannot be an audit actor (a token's name, a command's ``--actor``)."""
    if not name.strip():
        return f"{what} must name a person or a team"
    if len(name.strip()) > MAX_NAME or any(ch < " " or ch == "\x7f" for ch in name):
        return (f"{what} must be at most {MAX_NAME} characters, without control characters"
                " (it is the audit log's actor)")
    return None


def cli_principal(actor: str, role: str) -> Principal:
    """Who runs a command: ``actor`` (its ``--actor``, checked by :func:`name_problem`)
    in ``role``, audited as ``<role>:cli:<actor>`` so it is never taken for the console
    token of the same name."""
    return Principal("cli", CLI_PREFIX + actor.strip(), role, ())


def create_token(conn: psycopg.Connection[Any], *, name: str, role: str,
                 app_ids: Sequence[str] = (), created_by: str,
                 expires_in_s: float | None = None) -> tuple[str, str]:
    """A new token: ``(token_id, token)``; the token is not stored and cannot be shown
    again. ``expires_in_s`` None: it never expires. Raises ValueError on a bad role,
    name, app list or lifetime."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    problem = name_problem(name, "name")
    if problem is None and name.strip().startswith(CLI_PREFIX):
        problem = f"name may not begin with {CLI_PREFIX!r} (the command line's actors do)"
    if problem:
        raise ValueError(problem)
    if role == "publisher" and not app_ids:
        raise ValueError("a publisher token needs at least one app id")
    if role != "publisher" and app_ids:
        raise ValueError("only publisher tokens are scoped to apps")
    if expires_in_s is not None and not 0 < expires_in_s <= 10 * 365 * 86400:
        raise ValueError("the lifetime must be more than 0 and at most 10 years")
    token_id = new_id("tok", int(time.time() * 1000))
    token = "pbc_" + secrets.token_urlsafe(32)
    conn.execute(
        "INSERT INTO console_tokens (token_id, token_hash, name, role, app_ids, created_by,"
        " expires_at) VALUES (%s, %s, %s, %s, %s, %s,"
        " now() + make_interval(secs => %s::double precision))",
        (token_id, _hash(token), name.strip(), role, list(app_ids), created_by, expires_in_s),
    )
    conn.execute(
        "INSERT INTO audit_log (actor, action, target_type, target_id, after)"
        " VALUES (%s, 'console.token_create', 'console_token', %s, %s)",
        (created_by, token_id, Jsonb(
            {"name": name.strip(), "role": role, "app_ids": list(app_ids),
             "expires_in_s": expires_in_s})),
    )
    return token_id, token


def _principal(row: Sequence[Any] | None) -> Principal | None:
    if row is None:
        return None
    return Principal(row[0], row[1], row[2], tuple(row[3]))


def _touch(conn: psycopg.Connection[Any], p: Principal | None) -> Principal | None:
    """Record the token's use, at most once a minute (the token list's "last used")."""
    if p is not None:
        conn.execute(
            "UPDATE console_tokens SET last_used_at = now() WHERE token_id = %s AND"
            " (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')",
            (p.token_id,))
    return p


def lookup_token(conn: psycopg.Connection[Any], token: str) -> Principal | None:
    """The principal of a live token (not revoked, not expired), else None."""
    row = conn.execute(
        "SELECT token_id, name, role, app_ids FROM console_tokens"
        f" WHERE token_hash = %s AND {_LIVE}", (_hash(token.strip()),),
    ).fetchone()
    return _touch(conn, _principal(row))


def list_tokens(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Every token (never the secret), oldest first, with its state: ``active``,
    ``expired`` or ``revoked``."""
    rows = conn.execute(
        "SELECT token_id, name, role, app_ids, created_at, created_by, expires_at,"
        " last_used_at, revoked_at, expires_at IS NOT NULL AND expires_at <= now()"
        " FROM console_tokens ORDER BY created_at, token_id").fetchall()
    return [{"token_id": r[0], "name": r[1], "role": r[2], "app_ids": list(r[3]),
             "created_at": r[4], "created_by": r[5], "expires_at": r[6],
             "last_used_at": r[7], "revoked_at": r[8],
             "state": "revoked" if r[8] is not None else "expired" if r[9] else "active"}
            for r in rows]


def revoke_token(conn: psycopg.Connection[Any], token_id: str, *, by: str,
                 note: str | None = None) -> bool:
    """Revoke a token (audited); False when there is no such token or it is already
    revoked. Its sessions end at their next request."""
    row = conn.execute(
        "UPDATE console_tokens SET revoked_at = now() WHERE token_id = %s"
        " AND revoked_at IS NULL RETURNING name, role", (token_id,)).fetchone()
    if row is None:
        return False
    conn.execute(
        "INSERT INTO audit_log (actor, action, target_type, target_id, before, after, note)"
        " VALUES (%s, 'console.token_revoke', 'console_token', %s, %s, %s, %s)",
        (by, token_id, Jsonb({"revoked": False}),
         Jsonb({"revoked": True, "name": row[0], "role": row[1]}), note),
    )
    return True


def _sig(key: bytes, message: str) -> str:
    return hmac.new(key, _bytes(message), hashlib.sha256).hexdigest()[:40]


def session_cookie(key: bytes, token_id: str, *, now_s: float | None = None) -> str:
    expires = int((now_s if now_s is not None else time.time()) + SESSION_S)
    body = f"{token_id}.{expires}.{secrets.token_hex(8)}"  # each sign-in a session of its own
    return f"{body}.{_sig(key, 'session|' + body)}"


def _session_parts(key: bytes, cookie: str, now_s: float | None) -> list[str] | None:
    """The cookie's (token id, expiry, nonce, signature) if its signature holds and it has
    not expired."""
    parts = cookie.split(".")
    if len(parts) != 4 or not (parts[1].isascii() and parts[1].isdigit()):
        return None
    body = ".".join(parts[:3])
    if not hmac.compare_digest(_bytes(parts[3]), _sig(key, "session|" + body).encode()):
        return None
    if int(parts[1]) < (now_s if now_s is not None else time.time()):
        return None
    return parts


def session_token_id(key: bytes, cookie: str) -> str | None:
    """The token id of a session cookie this console signed and that has not expired (its
    session may have ended since: signed out, its token revoked or expired), else None."""
    parts = _session_parts(key, cookie, None)
    return parts[0] if parts is not None else None


def lookup_session(conn: psycopg.Connection[Any], key: bytes, cookie: str,
                   *, now_s: float | None = None) -> Principal | None:
    parts = _session_parts(key, cookie, now_s)
    if parts is None:
        return None
    row = conn.execute(
        "SELECT token_id, name, role, app_ids FROM console_tokens"
        f" WHERE token_id = %s AND {_LIVE} AND NOT EXISTS (SELECT 1 FROM"
        " console_sessions_ended WHERE session = %s)", (parts[0], parts[3]),
    ).fetchone()
    return _touch(conn, _principal(row))


def end_session(conn: psycopg.Connection[Any], key: bytes, cookie: str) -> bool:
    """Sign out: the session ``cookie`` opened is refused from now on, on every console
    instance, even a copy of the cookie taken before (kept until it would have expired;
    the expired ones are dropped here). False: no live session to end."""
    parts = _session_parts(key, cookie, None)
    if parts is None:
        return False
    conn.execute("DELETE FROM console_sessions_ended WHERE expires_at < now()")
    conn.execute(
        "INSERT INTO console_sessions_ended (session, token_id, expires_at)"
        " VALUES (%s, %s, to_timestamp(%s)) ON CONFLICT DO NOTHING",
        (parts[3], parts[0], int(parts[1])))
    return True


def csrf_for(key: bytes, cookie: str) -> str:
    return _sig(key, "csrf|" + cookie)


def check_csrf(key: bytes, cookie: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest(csrf_for(key, cookie).encode(),
                                               _bytes(given or ""))


def _step_up_sig(key: bytes, p: Principal, endpoint_id: str, url: str, nonce: str,
                 expires: str) -> str:
    return _sig(key, "\x1f".join(("step-up", p.token_id, endpoint_id, url, nonce, expires)))


def issue_step_up(key: bytes, p: Principal, endpoint_id: str, url: str,
                  *, now_s: float | None = None) -> str:
    """A confirmation code for changing ``endpoint_id``'s URL to ``url``, for ``p`` only,
    valid :data:`STEP_UP_S` seconds and once (:func:`spend_step_up`)."""
    expires = str(int((now_s if now_s is not None else time.time()) + STEP_UP_S))
    nonce = secrets.token_urlsafe(12)
    return f"stp_{nonce}.{expires}.{_step_up_sig(key, p, endpoint_id, url, nonce, expires)}"


def spend_step_up(conn: psycopg.Connection[Any], key: bytes, p: Principal,
                  endpoint_id: str, url: str, code: str, *, now_s: float | None = None
                  ) -> bool:
    """Whether ``code`` confirms this change by this principal: signed for exactly this
    token, endpoint and URL, not expired, and not spent before (it is spent now, in the
    caller's transaction)."""
    parts = code.strip().split(".")
    if len(parts) != 3 or not parts[0].startswith("stp_") or not parts[1].isdigit():
        return False
    nonce, expires = parts[0][4:], parts[1]
    want = _step_up_sig(key, p, endpoint_id, url, nonce, expires)
    if not hmac.compare_digest(_bytes(parts[2]), want.encode()):
        return False
    if int(expires) < (now_s if now_s is not None else time.time()):
        return False
    conn.execute("DELETE FROM console_step_ups WHERE used_at < now() - interval '1 day'")
    spent = conn.execute(
        "INSERT INTO console_step_ups (nonce, token_id) VALUES (%s, %s)"
        " ON CONFLICT (nonce) DO NOTHING RETURNING nonce", (nonce, p.token_id)).fetchone()
    return spent is not None
