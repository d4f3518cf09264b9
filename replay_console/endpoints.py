"""Console actions on endpoints: validated edits (step-up for a URL), secret rotation, and
test-send through the real render, sign and transport (where a user may send:
:mod:`replay_console.reach`).

Step-up: a URL change that passes every check is not saved at once. The answer is 409
with ``step_up: true`` and a ``confirmation`` code (:func:`replay_console.auth.issue_step_up`:
signed, bound to the principal's token, the endpoint and the new URL, valid five minutes,
single use); the change is saved when the same change comes back with that code in
``confirmation``. A wrong, expired or spent code is refused (403).

Test-send shows no live signature: the receiver gets the request signed with the
endpoint's active secrets (it verifies as a real delivery would), but the request the
console answers with has every signature value replaced by ``[redacted]`` (``v1,[redacted]``
per Standard Webhooks signature, so a rotation still shows two), and any copy of a
signature in the receiver's response excerpt is redacted too."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.core.endpoint import Endpoint, EndpointConfig
from postbacks.core.fanout import ROUTABLE_APP_ID
from postbacks.core.override import Override, apply_override
from postbacks.core.redact import MASK, Redaction, redact_request
from postbacks.errors import ConfigError
from postbacks.settings import Settings
from replay_console.auth import STEP_UP_S, Principal, issue_step_up, spend_step_up
from replay_console.queries import NotFound, masked_config
from replay_console.reach import check_target
from replay_console.rules import ActionError, Lookup, audit, require

__all__ = [
    "REDACTED",
    "add_secret",
    "audit_test_send",
    "create_endpoint",
    "load_endpoint",
    "load_for_test_send",
    "save_endpoint",
    "test_send",
]


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
    confirmation: str | None = None, note: str | None = None, lookup: Lookup | None = None,
    step_up_key: bytes | None = None,
) -> list[str]:
    """Validate and save an endpoint change (admin). A URL change needs step-up: the
    ``confirmation`` code this function hands out (409, signed with ``step_up_key``) for
    exactly this change. Returns the problems found (nothing is saved unless the list is
    empty); raises ActionError for rights and step-up."""
    from postbacks.core.endpoint_check import endpoint_problems
    from postbacks.core.providers.base import saved_header_problems

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
    problems += endpoint_problems(  # (redact_fields saved before stand)
        new, now_ms=int(time.time() * 1000),
        redact=new.config.redact_fields != current.config.redact_fields)
    if new.config.headers != current.config.headers:  # (headers saved before still send)
        problems += saved_header_problems(new.config.headers)
    if new.url != current.url:
        why = check_target(new.url, allow_loopback=settings.allow_loopback_targets,
                                 lookup=lookup)
        if why:
            problems.append(why)
        if not problems:
            step_up(conn, p, endpoint_id, new.url, confirmation, step_up_key)
    if problems:
        return problems
    before = _endpoint_json(current)
    after = _endpoint_json(new, changed={k for k, v in new.config.headers.items()
                                         if current.config.headers.get(k) != v})
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


def step_up(conn: psycopg.Connection[Any], p: Principal, endpoint_id: str, url: str,
            confirmation: str | None, key: bytes | None) -> None:
    """Return when ``confirmation`` confirms this URL change (and spend it); else raise:
    409 with a new code when none was given, 403 when the one given does not hold."""
    if key is None:
        raise ActionError("an endpoint's URL is changed in the console (step-up)", 400)
    if not confirmation:
        raise ActionError(
            f"changing an endpoint's URL needs confirmation: send the same change again "
            f"with this confirmation code within {STEP_UP_S // 60} minutes", 409,
            step_up=True, confirmation=issue_step_up(key, p, endpoint_id, url),
            expires_in_s=STEP_UP_S, url=url)
    if not spend_step_up(conn, key, p, endpoint_id, url, confirmation):
        raise ActionError("the confirmation code is wrong, expired, already used or for "
                          "another change: send the change without it for a new one", 403,
                          step_up=True)


def _endpoint_json(e: Endpoint, changed: set[str] | frozenset[str] = frozenset()
                   ) -> dict[str, Any]:
    """The endpoint as the audit log records it: header values masked, those in
    ``changed`` marked so (a credential rotated shows in the audit's diff, not its value)."""
    config = masked_config(e.config.to_json())
    if changed and isinstance(config.get("headers"), dict):
        config["headers"] = {k: v + (" (changed)" if k in changed else "")
                             for k, v in config["headers"].items()}
    return {"url": e.url, "config": config,
            "event_types": sorted(e.event_types), "enabled": e.enabled}


def create_endpoint(
    conn: psycopg.Connection[Any], settings: Settings, p: Principal, *, app_id: str,
    url: str, provider: str = "v3", event_types: Sequence[str] = ("*",),
    config: dict[str, Any] | None = None, name: str = "", note: str | None = None,
    lookup: Lookup | None = None,
) -> tuple[list[str], dict[str, Any] | None]:
    """Create an endpoint (admin) with a new signing secret. The same checks as an edit
    (:func:`~postbacks.core.endpoint_check.endpoint_problems`: URL, provider, macros,
    event types, a dry render; then the SSRF check of the URL); nothing is stored unless
    they all pass. Returns ``(problems, None)`` or ``([], created)``, where ``created``
    holds the endpoint id, the secret id and the secret itself (shown once, never stored
    in clear nor audited)."""
    from postbacks.core.endpoint_check import endpoint_problems
    from postbacks.core.providers.base import saved_header_problems
    from postbacks.core.signing import generate_secret
    from postbacks.db.crypto import SecretBox
    from postbacks.db.endpoints import add_secret as store
    from postbacks.ids import new_id
    require(p, "edit_endpoint", "create endpoints")
    app_id = app_id.strip()
    if not ROUTABLE_APP_ID.fullmatch(app_id):
        return [f"app {app_id[:60]!r} is not a valid app id"], None
    now_ms = int(time.time() * 1000)
    try:
        cfg = EndpointConfig.from_json(config or {})
    except ConfigError as exc:
        return [f"config: {exc}"], None
    new = Endpoint(endpoint_id=new_id("ep", now_ms), app_id=app_id, url=url.strip(),
                   provider=provider.strip(), config=cfg,
                   event_types=frozenset(t.strip() for t in event_types if t.strip()))
    problems = endpoint_problems(new, now_ms=now_ms) + saved_header_problems(cfg.headers)
    why = check_target(new.url, allow_loopback=settings.allow_loopback_targets, lookup=lookup)
    if why:
        problems.append(why)
    if problems:
        return problems, None
    conn.execute(
        "INSERT INTO endpoints (endpoint_id, app_id, url, event_types, provider, name, config)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s)",
        (new.endpoint_id, new.app_id, new.url, sorted(new.event_types), new.provider,
         name.strip(), Jsonb(new.config.to_json())))
    secret = generate_secret()
    secret_id = store(conn, SecretBox(settings.secrets_key.reveal()), new.endpoint_id, secret,
                      now_ms=now_ms)
    audit(conn, p, "endpoint.create", "endpoint", new.endpoint_id, None,
          {**_endpoint_json(new), "app_id": new.app_id, "provider": new.provider,
           "name": name.strip(), "secret_id": secret_id}, note)
    return [], {"endpoint_id": new.endpoint_id, "app_id": new.app_id,
                "secret_id": secret_id, "secret": secret}


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
                    override: Override | None = None, lookup: Lookup | None = None,
                    by: str | None = None) -> dict[str, Any]:
    """Render a sample delivery for ``endpoint`` (plus an optional override) through the
    real render and sign path, send it through the real transport (SSRF guard included)
    and return the exact request (signatures and the endpoint's custom header values
    redacted) and the receiver's response.
    ``lookup`` is the console's DNS seam, used by the transport too when given."""
    import asyncio

    from postbacks.core.endpoint_check import sample_delivery
    from postbacks.core.render import RenderError, render
    from postbacks.transport.http import EXCERPT_BYTES, HttpTransport

    ep = apply_override(endpoint, override, by=by)  # by: the sender (as a replay's copy)
    now_ms = int(time.time() * 1000)
    d = sample_delivery(ep, now_ms=now_ms)
    try:
        req = render(d, ep, now_ms=now_ms)
    except RenderError as exc:
        return {"ok": False, "stage": "render", "error": str(exc)}
    signatures = _signatures(d, ep, dict(req.headers), now_ms)
    # The endpoint's own custom header values (an API key) are shown only to admins, on the
    # endpoint's page: masked as the attempt log masks them (by name, and where echoed).
    custom = Redaction.of((), ep.config.headers)
    shown = redact_request(req, custom)
    request = {"method": req.method, "url": req.url,
               "headers": {k: _redact(v, signatures) for k, v in shown.headers.items()},
               "body": req.body.decode("utf-8", "replace")}
    resolve = None
    if lookup is not None:
        seam = lookup

        async def resolve(host: str) -> list[str]:
            return await asyncio.to_thread(seam, host)
    async with HttpTransport(timeout_s=settings.http_timeout_s,
                             allow_loopback=settings.allow_loopback_targets, limit=4,
                             lookup=resolve) as t:
        result = await t.send(req, follow_redirects=ep.config.follow_redirects)
    excerpt = (custom.scrub(result.excerpt) if result.body is None  # (masked, then cut: a
               else custom.excerpt(result.body, EXCERPT_BYTES))  # key across the cut, too)
    response = {"status": result.http.status, "error_class": result.http.error_class,
                "blocked": result.blocked, "wire_ms": round(result.wire_ms, 1),
                "body_excerpt": _redact((excerpt or b"").decode("utf-8", "replace"),
                                        signatures)}
    ok = result.blocked is None and result.http.status is not None \
        and 200 <= result.http.status < 300
    return {"ok": ok, "stage": "send", "request": request, "response": response}


REDACTED = MASK


def _signatures(d: Any, ep: Endpoint, headers: dict[str, str], now_ms: int) -> set[str]:
    """The parts of the rendered headers made with the endpoint's secrets: the request is
    rendered again with other keys, and every space-separated value that changes is one
    (a Standard Webhooks ``v1,...``, a provider's hex, whatever the provider signs with)."""
    from postbacks.core.render import render

    other = replace(ep, secrets=tuple(replace(s, key=os.urandom(32)) for s in ep.secrets))
    again = dict(render(d, other, now_ms=now_ms).headers)
    out: set[str] = set()
    for k, v in headers.items():
        if again.get(k) != v:
            seen = set(again.get(k, "").split(" "))
            out.update(t for t in v.split(" ") if t and t not in seen)
    return out


_SCHEME = re.compile(r"[a-z0-9]{1,16}")  # sha256= (a base64 value's padding is no scheme)


def _redact(text: str, signatures: set[str]) -> str:
    """``text`` with every signature in it replaced (``v1,<sig>`` keeps its ``v1,``, a
    partner's ``sha256=<hex>`` its ``sha256=``), the bare value too, wherever echoed."""
    for sig in sorted(signatures, key=len, reverse=True):
        sep = "," if "," in sig else "="
        scheme, found, value = sig.partition(sep)
        if found and value.strip("=") and (sep == "," or _SCHEME.fullmatch(scheme)):
            text = text.replace(sig, f"{scheme}{sep}{REDACTED}")
            text = text.replace(value, REDACTED)
        else:
            text = text.replace(sig, REDACTED)
    return text


def audit_test_send(conn: psycopg.Connection[Any], p: Principal, endpoint_id: str,
                    sent: dict[str, Any]) -> None:
    audit(conn, p, "endpoint.test_send", "endpoint", endpoint_id, None,
           {"ok": sent["ok"], "url": sent.get("request", {}).get("url"),
            "status": sent.get("response", {}).get("status")})
