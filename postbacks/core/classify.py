"""What an HTTP result means for a delivery: typed outcomes instead of flags."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Delivered",
    "HttpResult",
    "Permanent",
    "Retryable",
    "Verdict",
    "classify",
]


@dataclass(frozen=True, slots=True)
class HttpResult:
    """What the wire gave back: a status, or an error class when there was no response."""

    status: int | None
    error_class: str | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Delivered:
    status: int


@dataclass(frozen=True, slots=True)
class Retryable:
    error_class: str
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Permanent:
    error_class: str


Verdict = Delivered | Retryable | Permanent

MAX_RETRY_AFTER_S = 3600.0


def classify(r: HttpResult) -> Verdict:
    """2xx -> delivered; timeout, connection error, 5xx, 408, 429 -> retry; other (a
    status outside 100..599 included: it has no class) -> permanent."""
    if r.status is None:
        return Retryable(r.error_class or "connection_error")
    if 200 <= r.status < 300:
        return Delivered(r.status)
    after = None if r.retry_after_s is None else min(max(r.retry_after_s, 0.0), MAX_RETRY_AFTER_S)
    if r.status in (408, 429) or 500 <= r.status <= 599:
        return Retryable(f"http_{r.status}", after if r.status in (429, 503) else None)
    return Permanent(f"http_{r.status}")
