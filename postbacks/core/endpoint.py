"""An endpoint's configuration as the stages see it (loaded from PostgreSQL)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Endpoint", "SigningSecret", "active_keys"]


@dataclass(frozen=True, slots=True)
class SigningSecret:
    secret_id: str
    key: bytes = field(repr=False)
    active_from_ms: int
    active_until_ms: int | None = None

    def active_at(self, now_ms: int) -> bool:
        return self.active_from_ms <= now_ms and (
            self.active_until_ms is None or now_ms < self.active_until_ms
        )


@dataclass(frozen=True, slots=True)
class Endpoint:
    endpoint_id: str
    app_id: str
    url: str
    event_types: frozenset[str]
    provider: str = "v3"
    method: str = "POST"
    enabled: bool = True
    concurrency: int = 4
    secrets: tuple[SigningSecret, ...] = ()

    def subscribes(self, app_id: str, event_type: str) -> bool:
        return self.enabled and self.app_id == app_id and (
            "*" in self.event_types or event_type in self.event_types
        )


def active_keys(endpoint: Endpoint, now_ms: int) -> list[bytes]:
    """Keys to sign with now: every secret whose window contains ``now`` (two in rotation)."""
    return [s.key for s in endpoint.secrets if s.active_at(now_ms)]
