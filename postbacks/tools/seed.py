"""Seed endpoints (and their signing secrets) for the demo, tests and benchmarks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from postbacks.core.endpoint import EndpointConfig
from postbacks.core.signing import generate_secret
from postbacks.db.connect import connect
from postbacks.db.crypto import SecretBox
from postbacks.db.endpoints import add_secret, end_other_secrets, upsert_endpoint
from postbacks.settings import Settings

__all__ = ["SeededEndpoint", "app_id_for", "seed_endpoints"]


def app_id_for(namespace: str, n: int) -> str:
    return f"app_{namespace}_{n:04d}"


@dataclass(frozen=True, slots=True)
class SeededEndpoint:
    endpoint_id: str
    app_id: str
    url: str
    secret: str


def seed_endpoints(
    settings: Settings, *, apps: int, endpoints_per_app: int, receiver_url: str,
    namespace: str = "demo", now_ms: int, config: EndpointConfig | None = None,
    concurrency: int = 4,
) -> list[SeededEndpoint]:
    """Create ``apps x endpoints_per_app`` endpoints ``ep_<ns>_<app>_<k>``, one secret each.

    Apps are ``app_<ns>_0001`` ... (see :func:`app_id_for`); re-seeding replaces the
    endpoints' URLs and signing secrets: the fresh secret is the only active one (the
    seeded receivers verify with it; stages already running sign with it from their next
    config refresh, so seed before starting them), so an endpoint seeded many times still
    signs each request once. ``config`` and ``concurrency`` apply to every endpoint seeded
    (the demo's dead endpoint carries its own ``max_attempts``).
    """
    box = SecretBox(settings.secrets_key.reveal())
    out: list[SeededEndpoint] = []
    with connect(settings.database_url) as conn:
        for a in range(1, apps + 1):
            app_id = app_id_for(namespace, a)
            for k in range(1, endpoints_per_app + 1):
                endpoint_id = f"ep_{namespace}_{a:04d}_{k}"
                url = f"{receiver_url.rstrip('/')}/hooks/{endpoint_id}"
                upsert_endpoint(conn, endpoint_id=endpoint_id, app_id=app_id, url=url,
                                name=f"{namespace} endpoint {a}/{k}", config=config,
                                concurrency=concurrency)
                seed = hashlib.sha256(f"{namespace}/{endpoint_id}/{now_ms}".encode()).digest()
                secret = generate_secret(seed)
                secret_id = add_secret(conn, box, endpoint_id, secret, now_ms=now_ms)
                end_other_secrets(conn, endpoint_id, secret_id, overlap_s=0)
                out.append(SeededEndpoint(endpoint_id, app_id, url, secret))
        conn.commit()
    return out
