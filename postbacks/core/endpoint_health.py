"""An endpoint's delivery health from its attempts, and when to disable it; pure.

The sink folds each batch of attempts into a :class:`BatchHealth` per endpoint and merges it
into the stored row (``endpoint_health``): the last success, the first failure since it
(``failing_since``: None while it succeeds), the last ``410 Gone``. An endpoint's attempts
are all on one partition (keyed by endpoint), so a batch holds them in the order they were
made.

Auto-disable (seed 003): an endpoint that has **only failed** for ``after_s`` (72 h by
default) is disabled, and so at once is one whose config says ``disable_on_gone`` and
that answered ``410 Gone`` after its last success. Its deliveries are then parked (held
with reason ``endpoint_disabled``), never dropped, until a person re-enables it.
Failures are the receiver's: ``retryable``, ``permanent`` and ``validation_failed``; a
render failure or a blocked address is the platform's and says nothing of the endpoint.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["FAILURES", "BatchHealth", "Health", "disable_reason", "fold_attempts", "merge"]

FAILURES = frozenset({"retryable", "permanent", "validation_failed"})
GONE = 410


@dataclass(frozen=True, slots=True)
class BatchHealth:
    """What one batch of an endpoint's attempts says (epoch ms)."""

    last_success_ms: int | None
    failing_since_ms: int | None  # the first failure after the batch's last success
    last_gone_ms: int | None


@dataclass(frozen=True, slots=True)
class Health:
    """The stored state of an endpoint (epoch ms)."""

    last_success_ms: int | None
    failing_since_ms: int | None
    last_gone_ms: int | None


def fold_attempts(attempts: Iterable[tuple[str, int, str, int | None]],
                  ) -> dict[str, BatchHealth]:
    """(endpoint_id, attempted_at_ms, result, status_code) -> each endpoint's BatchHealth.
    Attempts need not be sorted; only the receiver's answers count."""
    by_ep: dict[str, list[tuple[int, str, int | None]]] = {}
    for ep, at, result, status in attempts:
        by_ep.setdefault(ep, []).append((at, result, status))
    out: dict[str, BatchHealth] = {}
    for ep, rows in by_ep.items():
        rows.sort(key=lambda r: r[0])
        success = max((at for at, result, _ in rows if result == "delivered"), default=None)
        failing = min((at for at, result, _ in rows if result in FAILURES
                       and (success is None or at > success)), default=None)
        gone = max((at for at, _, status in rows if status == GONE), default=None)
        if success is None and failing is None and gone is None:
            continue  # nothing the receiver said
        out[ep] = BatchHealth(success, failing, gone)
    return out


def merge(stored: Health | None, batch: BatchHealth) -> Health:
    """The stored state after a batch (the sink's SQL applies the same rule)."""
    if stored is None:
        return Health(batch.last_success_ms, batch.failing_since_ms, batch.last_gone_ms)
    newest = _max(stored.last_success_ms, batch.last_success_ms)
    if batch.last_success_ms is not None and batch.last_success_ms == newest:
        failing = batch.failing_since_ms  # the batch holds the newest success
    else:
        failing = stored.failing_since_ms if stored.failing_since_ms is not None \
            else batch.failing_since_ms
    return Health(newest, failing, _max(stored.last_gone_ms, batch.last_gone_ms))


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def disable_reason(h: Health, *, now_ms: int, after_s: float,
                   disable_on_gone: bool) -> str | None:
    """Why this endpoint should be disabled now, or None."""
    if disable_on_gone and h.last_gone_ms is not None and (
            h.last_success_ms is None or h.last_gone_ms > h.last_success_ms):
        return f"HTTP 410 Gone at {_iso(h.last_gone_ms)} (disable_on_gone)"
    if h.failing_since_ms is not None and now_ms - h.failing_since_ms >= after_s * 1000:
        hours = (now_ms - h.failing_since_ms) / 3_600_000
        return f"only failures since {_iso(h.failing_since_ms)} ({hours:.1f} h)"
    return None


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
