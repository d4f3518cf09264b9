"""Console actions on endpoints: the SSRF check of a typed URL, validated edits (step-up
for a URL), secret rotation, and test-send through the real render, sign and transport."""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import psycopg
from psycopg.types.json import Jsonb

from postbacks.core.endpoint import Endpoint, EndpointConfig
from postbacks.core.override import Override, apply_override
from postbacks.core.ssrf import blocked_reason, parse_host_literal, url_blocked_reason
from postbacks.errors import ConfigError
from postbacks.settings import Settings
from replay_console.auth import Principal, lookup_token
from replay_console.queries import NotFound, masked_config
from replay_console.rules import ActionError, Lookup, audit, require

__all__ = [
    "add_secret",
    "audit_test_send",
    "check_target",
    "load_endpoint",
    "load_for_test_send",
    "save_endpoint",
    "test_send",
]


# --- SSRF check of a URL someone typed --------------------------------------------------

def _system_lookup(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(i[4][0]) for i in infos]


def check_target(url: str, *, allow_loopback: bool, lookup: Lookup | None = None
                       ) -> str | None:
    """Why ``url`` may not be a postback target, or None. Stricter than the transport
    (which connects only to the allowed addresses of a name): a URL is refused on save
    when its host resolves to ANY refused address, or does not resolve."""
    problem = url_blocked_reason(url, allow_loopback=allow_loopback)
    if problem:
        return f"{url}: {problem}"
    host = urlsplit(url).hostname or ""
    if parse_host_literal(host) is not None:
        return None  # an allowed literal (url_blocked_reason judged it)
    try:
        addresses = (lookup or _system_lookup)(host)
    except (OSError, UnicodeError) as exc:
        return f"{url}: host {host!r} does not resolve ({exc})"
    if not addresses:
        return f"{url}: host {host!r} does not resolve"
    for a in addresses:
        why = blocked_reason(a, allow_loopback=allow_loopback)
        if why:
            return f"{url}: host {host!r} resolves to {a}, refused ({why})"
    return None


# --- endpoints --------------------------------------------------------------------------

def load_endpoint(conn: psycopg.Connection[Any], endpoint_id: str) -> Endpoint:
    """The endpoint as the agent would render with it (secrets not loaded)."""
    row = conn.execute(
        "SELECT endpoint_id, app_id, url, method, provider, event_types, enabled, concurrency,"
        " config FROM endpoints WHERE endpoint_id = %s", (endpoint_id,),
    ).fetchone()
    if row is None:
        raise NotFound(f"no endpoint {endpoint_id!r}")
    try:
        config, error = EndpointConfig.from_json(row[8]), None
    except ConfigError as exc:
        config, error = EndpointConfig(), f"stored endpoint config is invalid: {exc}"
    return Endpoint(endpoint_id=row[0], app_id=row[1], url=row[2], method=row[3],
                    provider=row[4], event_types=frozenset(row[5]), enabled=row[6],
                    concurrency=row[7], config=config, config_error=error)


def save_endpoint(
    conn: psycopg.Connection[Any], settings: Settings, p: Principal, endpoint_id: str, *,
    url: str | None = None, config: dict[str, Any] | None = None,
    event_types: Sequence[str] | None = None, enabled: bool | None = None,
    confirm_token: str | None = None, note: str | None = None, lookup: Lookup | None = None,
) -> list[str]:
    """Validate and save an endpoint change (admin). A URL change needs step-up: the
    admin's own token again in ``confirm_token``. Returns the problems found (nothing is
    saved unless the list is empty); raises ActionError for rights and step-up."""
    from postbacks.core.endpoint_check import endpoint_problems

    require(p, "edit_endpoint", "change endpoint configuration")
    current = load_endpoint(conn, endpoint_id)
    new = current
    problems: list[str] = []
    if config is not None:
        try:
            new = replace(new, config=EndpointConfig.from_json(config), config_error=None)
        except ConfigError as exc:
            problems.append(f"config: {exc}")
    if url is not None:
        new = replace(new, url=url.strip())
    if event_types is not None:
        new = replace(new, event_types=frozenset(t.strip() for t in event_types if t.strip()))
    if enabled is not None:
        new = replace(new, enabled=enabled)
    if problems:
        return problems
    problems += endpoint_problems(new, now_ms=int(time.time() * 1000))
    if new.url != current.url:
        why = check_target(new.url, allow_loopback=settings.allow_loopback_targets,
                                 lookup=lookup)
        if why:
            problems.append(why)
        if not problems:
            again = lookup_token(conn, confirm_token or "") if confirm_token else None
            if again is None or again.token_id != p.token_id:
                raise ActionError("changing an endpoint's URL needs step-up: enter your "
                                  "sign-in token again to confirm", 401, step_up=True)
    if problems:
        return problems
    before = _endpoint_json(current)
    after = _endpoint_json(new)
    if before == after and new.config == current.config:
        return []
    conn.execute(
        "UPDATE endpoints SET url = %s, config = %s, event_types = %s, enabled = %s,"
        " updated_at = now() WHERE endpoint_id = %s",
        (new.url, Jsonb(new.config.to_json()), sorted(new.event_types), new.enabled,
         endpoint_id),
    )
    audit(conn, p, "endpoint.update", "endpoint", endpoint_id, before, after, note)
    return []


def _endpoint_json(e: Endpoint) -> dict[str, Any]:
    """The endpoint as the audit log records it (header values masked)."""
    return {"url": e.url, "config": masked_config(e.config.to_json()),
            "event_types": sorted(e.event_types), "enabled": e.enabled}


def add_secret(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
               endpoint_id: str, secret: str, *, overlap_s: float = 24 * 3600.0) -> str:
    """Rotate: a new signing secret, active now; every other open secret of the endpoint
    stays active for ``overlap_s`` more (both signatures are sent meanwhile). Audited
    without the secret."""
    from postbacks.db.crypto import SecretBox
    from postbacks.db.endpoints import add_secret as store
    from postbacks.db.endpoints import end_other_secrets

    require(p, "edit_endpoint", "rotate signing secrets")
    if not 0 <= overlap_s <= 30 * 86400:
        raise ActionError("overlap_s must be between 0 and 2592000 (30 days)")
    load_endpoint(conn, endpoint_id)
    box = SecretBox(settings.secrets_key.reveal())
    try:
        secret_id = store(conn, box, endpoint_id, secret.strip(), now_ms=int(time.time() * 1000))
    except (ValueError, ConfigError) as exc:
        raise ActionError(f"secret: {exc}") from exc
    ended = end_other_secrets(conn, endpoint_id, secret_id, overlap_s)
    audit(conn, p, "endpoint.rotate_secret", "endpoint", endpoint_id,
           {"ending": ended}, {"added": secret_id, "overlap_s": overlap_s})
    return secret_id


# --- test-send --------------------------------------------------------------------------

def load_for_test_send(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
                       endpoint_id: str) -> Endpoint:
    """The endpoint with its signing secrets, for :func:`test_send` (support and up)."""
    from postbacks.db.crypto import SecretBox
    from postbacks.db.endpoints import load_endpoints

    require(p, "test_send", "test-send")
    found = load_endpoints(conn, SecretBox(settings.secrets_key.reveal()), only=endpoint_id)
    if not found:
        raise ActionError(f"no endpoint {endpoint_id!r}", 404)
    return found[0]


async def test_send(settings: Settings, endpoint: Endpoint, *,
                    override: Override | None = None) -> dict[str, Any]:
    """Render a sample delivery for ``endpoint`` (plus an optional override) through the
    real render and sign path, send it through the real transport (SSRF guard included)
    and return the exact request and the receiver's response."""
    from postbacks.core.endpoint_check import sample_delivery
    from postbacks.core.render import RenderError, render
    from postbacks.transport.http import HttpTransport

    ep = apply_override(endpoint, override)
    now_ms = int(time.time() * 1000)
    d = sample_delivery(ep, now_ms=now_ms)
    try:
        req = render(d, ep, now_ms=now_ms)
    except RenderError as exc:
        return {"ok": False, "stage": "render", "error": str(exc)}
    request = {"method": req.method, "url": req.url, "headers": dict(req.headers),
               "body": req.body.decode("utf-8", "replace")}
    async with HttpTransport(timeout_s=settings.http_timeout_s,
                             allow_loopback=settings.allow_loopback_targets, limit=4) as t:
        result = await t.send(req, follow_redirects=ep.config.follow_redirects)
    response = {"status": result.http.status, "error_class": result.http.error_class,
                "blocked": result.blocked, "wire_ms": round(result.wire_ms, 1),
                "body_excerpt": (result.excerpt or b"").decode("utf-8", "replace")}
    ok = result.blocked is None and result.http.status is not None \
        and 200 <= result.http.status < 300
    return {"ok": ok, "stage": "send", "request": request, "response": response}


def audit_test_send(conn: psycopg.Connection[Any], p: Principal, endpoint_id: str,
                    sent: dict[str, Any]) -> None:
    audit(conn, p, "endpoint.test_send", "endpoint", endpoint_id, None,
           {"ok": sent["ok"], "url": sent.get("request", {}).get("url"),
            "status": sent.get("response", {}).get("status")})
