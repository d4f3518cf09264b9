"""Per-endpoint circuit breaker with a probe and a recovery ramp. Pure: ``now`` is passed in.

closed --N consecutive failures--> open --open period over--> half_open (one probe)
half_open --probe succeeds--> ramping (10% -> 100% of the cap over the ramp) --> closed
half_open --probe fails--> open (a new open period)
ramping --N consecutive failures--> open

While open, and for everything but the probe while half-open, deliveries are diverted to
the quarantine topic with a ``due_at`` — no attempt is consumed.

Shared and durable: every transition has a time (``changed_ms``) and is published by the
agent that made it (compacted topic ``breakers.v1``, see :func:`to_record`); every agent
reads them all (from the beginning at start) and :func:`merge` folds them in, the latest
transition winning. So a breaker opened by one agent is open in all of them and in an
agent started later, and while one agent's probe is out the others divert too (for at most
``probe_timeout_s``: a probe whose agent died does not hold the breaker half-open). Failure
counts are each agent's own until one of them opens the breaker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from postbacks.records import BreakerStateRecord

__all__ = ["CIRCUIT", "BreakerPolicy", "BreakerState", "Divert", "Send", "admit", "from_record",
           "merge", "not_ahead", "on_result", "to_record"]

CIRCUIT = "circuit"  # the detector of a circuit breaker's BreakerState record
_RANK = {"closed": 0, "ramping": 1, "half_open": 2, "open": 3}  # ties: the stricter wins


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failure_threshold: int = 20
    open_s: float = 300.0
    ramp_s: float = 300.0
    ramp_start: float = 0.1
    probe_retry_s: float = 10.0  # diverted while a probe is out: come back this much later
    probe_timeout_s: float = 60.0  # another agent's probe counts as out for at most this long


@dataclass(frozen=True, slots=True)
class BreakerState:
    state: str = "closed"  # closed | open | half_open | ramping
    consecutive_failures: int = 0
    opened_at_ms: int = 0
    ramp_started_ms: int = 0
    probe_in_flight: bool = False
    changed_ms: int = 0  # when the last transition happened (0: never)
    probe_until_ms: int = 0  # another agent's probe: ours may go at this time (0: ours)


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
        # the same time in every agent: the ramp's end
        s = replace(s, state="closed", changed_ms=s.ramp_started_ms + int(p.ramp_s * 1000))
    match s.state:
        case "closed":
            return Send(cap), s
        case "ramping":
            return Send(_ramp_concurrency(p, s, now_ms, cap)), s
        case "open":
            reopen_at = s.opened_at_ms + int(p.open_s * 1000)
            if now_ms < reopen_at:
                return Divert("breaker_open", reopen_at), s
            return Send(1, probe=True), replace(s, state="half_open", probe_in_flight=True,
                                                changed_ms=now_ms, probe_until_ms=0)
        case _:  # half_open
            if s.probe_in_flight and not (s.probe_until_ms and now_ms >= s.probe_until_ms):
                return Divert("breaker_probing", now_ms + int(p.probe_retry_s * 1000)), s
            return Send(1, probe=True), replace(s, probe_in_flight=True, changed_ms=now_ms,
                                                probe_until_ms=0)


def on_result(p: BreakerPolicy, s: BreakerState, now_ms: int, *, failed: bool,
              probe: bool) -> BreakerState:
    """Fold one attempt's health into the state (only endpoint-health failures count)."""
    if probe:
        if s.state != "half_open" or s.probe_until_ms:
            # another agent's transition came in while our probe was out: it stands, and
            # our probe's result counts as an ordinary attempt's
            return on_result(p, s, now_ms, failed=failed, probe=False)
        if failed:
            return BreakerState("open", p.failure_threshold, now_ms, changed_ms=now_ms)
        return BreakerState("ramping", 0, s.opened_at_ms, now_ms, changed_ms=now_ms)
    if not failed:
        return replace(s, consecutive_failures=0) if s.consecutive_failures else s
    n = s.consecutive_failures + 1
    if s.state in ("closed", "ramping") and n >= p.failure_threshold:
        return BreakerState("open", n, now_ms, changed_ms=now_ms)
    return replace(s, consecutive_failures=n)


def unused(s: BreakerState, *, probe: bool) -> BreakerState:
    """An admitted slot that sent nothing (the delivery was held, parked or dead-lettered
    instead): the probe it took is free again; nothing about the endpoint's health was
    learnt, so nothing else changes."""
    if probe and s.state == "half_open" and s.probe_in_flight and not s.probe_until_ms:
        return replace(s, probe_in_flight=False)
    return s


def not_ahead(remote: BreakerState, now_ms: int) -> BreakerState:
    """Another agent's transition with no time later than ``now_ms``: an agent whose clock
    ran ahead (by hours) made every other agent divert the endpoint, and ignore its own
    transitions, for as long as the skew."""
    times = (remote.changed_ms, remote.opened_at_ms, remote.ramp_started_ms)
    if max(times) <= now_ms:
        return remote
    changed, opened, ramp = (min(t, now_ms) for t in times)
    return replace(remote, changed_ms=changed, opened_at_ms=opened, ramp_started_ms=ramp)


def merge(p: BreakerPolicy, local: BreakerState, remote: BreakerState) -> BreakerState:
    """Fold another agent's published transition into this agent's state: the later
    transition wins (at the same time, the stricter state); an older one, or this agent's
    own coming back, changes nothing. Adopting a half-open breaker means another agent's
    probe is out: this one diverts until ``probe_timeout_s`` after it went."""
    if (remote.changed_ms, _RANK.get(remote.state, 0)) <= (local.changed_ms,
                                                            _RANK.get(local.state, 0)):
        return local
    if remote.state == "half_open":
        return replace(remote, probe_in_flight=True,
                       probe_until_ms=remote.changed_ms + int(p.probe_timeout_s * 1000))
    return replace(remote, probe_in_flight=False, probe_until_ms=0,
                   consecutive_failures=remote.consecutive_failures
                   if remote.state == "open" else 0)


def to_record(endpoint_id: str, s: BreakerState, actor: str | None,
              reason: str | None = None) -> BreakerStateRecord:
    """The record an agent publishes for a transition (keyed by ``endpoint_id``)."""
    return BreakerStateRecord(
        scope="endpoint", scope_key=endpoint_id, detector=CIRCUIT, state=s.state,
        changed_at=s.changed_ms, reason=reason, actor=actor, observed_value=None,
        baseline_value=None, opened_at=s.opened_at_ms or None,
        ramp_started_at=s.ramp_started_ms or None,
        consecutive_failures=s.consecutive_failures)


def from_record(rec: BreakerStateRecord) -> BreakerState | None:
    """A published circuit-breaker transition as a state to :func:`merge` (None: not one)."""
    if rec["detector"] != CIRCUIT or rec["state"] not in _RANK:
        return None
    return BreakerState(state=rec["state"],
                        consecutive_failures=rec.get("consecutive_failures") or 0,
                        opened_at_ms=rec.get("opened_at") or 0,
                        ramp_started_ms=rec.get("ramp_started_at") or 0,
                        changed_ms=rec["changed_at"])
