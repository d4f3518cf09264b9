"""Per-endpoint circuit breaker with a probe and a recovery ramp. Pure: ``now`` is passed in.

closed --N consecutive failures--> open --open period over--> half_open (one probe)
half_open --probe succeeds--> ramping (10% -> 100% of the cap over the ramp) --> closed
half_open --probe fails--> open (a new open period)
ramping --N consecutive failures--> open

While open, and for everything but the probe while half-open, deliveries are diverted to
the quarantine topic with a ``due_at`` — no attempt is consumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

__all__ = ["BreakerPolicy", "BreakerState", "Divert", "Send", "admit", "on_result"]


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failure_threshold: int = 20
    open_s: float = 300.0
    ramp_s: float = 300.0
    ramp_start: float = 0.1
    probe_retry_s: float = 10.0  # diverted while a probe is out: come back this much later


@dataclass(frozen=True, slots=True)
class BreakerState:
    state: str = "closed"  # closed | open | half_open | ramping
    consecutive_failures: int = 0
    opened_at_ms: int = 0
    ramp_started_ms: int = 0
    probe_in_flight: bool = False


@dataclass(frozen=True, slots=True)
class Send:
    """Send now with at most ``concurrency`` in flight; ``probe`` marks the half-open probe."""

    concurrency: int
    probe: bool = False


@dataclass(frozen=True, slots=True)
class Divert:
    reason: str
    due_at_ms: int


def _ramp_concurrency(p: BreakerPolicy, s: BreakerState, now_ms: int, cap: int) -> int:
    frac = min(1.0, max(0.0, (now_ms - s.ramp_started_ms) / (p.ramp_s * 1000)))
    return max(1, math.floor(cap * (p.ramp_start + (1 - p.ramp_start) * frac)))


def admit(
    p: BreakerPolicy, s: BreakerState, now_ms: int, cap: int
) -> tuple[Send | Divert, BreakerState]:
    """May a delivery to this endpoint be sent now? Returns the decision and the new state."""
    if s.state == "ramping" and now_ms - s.ramp_started_ms >= p.ramp_s * 1000:
        s = replace(s, state="closed")
    match s.state:
        case "closed":
            return Send(cap), s
        case "ramping":
            return Send(_ramp_concurrency(p, s, now_ms, cap)), s
        case "open":
            reopen_at = s.opened_at_ms + int(p.open_s * 1000)
            if now_ms < reopen_at:
                return Divert("breaker_open", reopen_at), s
            return Send(1, probe=True), replace(s, state="half_open", probe_in_flight=True)
        case _:  # half_open
            if s.probe_in_flight:
                return Divert("breaker_probing", now_ms + int(p.probe_retry_s * 1000)), s
            return Send(1, probe=True), replace(s, probe_in_flight=True)


def on_result(p: BreakerPolicy, s: BreakerState, now_ms: int, *, failed: bool,
              probe: bool) -> BreakerState:
    """Fold one attempt's health into the state (only endpoint-health failures count)."""
    if probe:
        if failed:
            return BreakerState("open", p.failure_threshold, now_ms)
        return BreakerState("ramping", 0, s.opened_at_ms, now_ms)
    if not failed:
        return replace(s, consecutive_failures=0) if s.consecutive_failures else s
    n = s.consecutive_failures + 1
    if s.state in ("closed", "ramping") and n >= p.failure_threshold:
        return BreakerState("open", n, now_ms)
    return replace(s, consecutive_failures=n)
