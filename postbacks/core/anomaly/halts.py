"""Halts as every reader of ``anomaly.control.v1`` sees them: the latest change per
(scope, detector) wins, a tie reads as tripped, and a scope is tripped while any of its
detectors is. The gates hold what they read from a tripped scope; the agents hold what
would still be sent in it (retries, quarantine) -- one book, the same rules.

A change read from the control topic is refused (:func:`refused`) when it names no
detector or is dated more than :data:`CONTROL_AHEAD_MS` ahead of the reader's clock: only
the gate (a trip, dated by its clock) and a person's close (``postbacks anomaly close``)
write there, and "the latest change wins" would let one record dated ahead win for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from postbacks.core.anomaly.modes import GLOBAL_SCOPE, Detector, HaltState, Scope, Trip
from postbacks.records import BreakerStateRecord

__all__ = [
    "CONTROL_AHEAD_MS",
    "HaltBook",
    "StartRefusals",
    "StateChange",
    "core_scope",
    "read_change",
    "refusal",
    "refused",
]

K = TypeVar("K")
CONTROL_AHEAD_MS = 5 * 60_000  # a change dated further ahead of the reader's clock: refused
_DETECTORS = frozenset(d.value for d in Detector)


@dataclass(frozen=True, slots=True)
class StateChange:
    """One halt state as read from PostgreSQL or the control topic."""

    scope: Scope  # core form: ("endpoint", id) or GLOBAL_SCOPE
    detector: str
    state: HaltState
    changed_at: int  # epoch ms; 0 when never changed


def core_scope(scope: str, scope_key: str, global_key: str) -> Scope | None:
    """The core's scope for a stored row, or None for another deployment's global rows."""
    if scope == "global":
        return GLOBAL_SCOPE if scope_key == global_key else None
    return (scope, scope_key) if scope == "endpoint" else None


class HaltBook:
    """The current halt per scope: the latest change wins; a tie reads as tripped."""

    def __init__(self) -> None:
        self._latest: dict[Scope, dict[str, StateChange]] = {}  # scope -> detector -> change
        self.halts: dict[Scope, HaltState] = {}  # what ``decide`` reads; only tripped kept

    def apply(self, change: StateChange) -> bool:
        """Merge one change; True when the scope's effective state changed."""
        by_detector = self._latest.setdefault(change.scope, {})
        cur = by_detector.get(change.detector)
        if cur is not None and (change.changed_at < cur.changed_at or (
                change.changed_at == cur.changed_at and cur.state is HaltState.TRIPPED)):
            return False
        by_detector[change.detector] = change
        before = self.halts.get(change.scope)
        if any(c.state is HaltState.TRIPPED for c in by_detector.values()):
            self.halts[change.scope] = HaltState.TRIPPED
        else:
            self.halts.pop(change.scope, None)
        return before is not self.halts.get(change.scope)

    def latest(self, scope: Scope, detector: str) -> StateChange | None:
        return self._latest.get(scope, {}).get(detector)

    def trip_now(self, trip: Trip, now_ms: int) -> None:
        """This instance tripped a scope: honour it here before anyone else hears of it.
        It is dated after the scope's last change even when that one is dated ahead of
        this clock (a close from a host whose clock runs ahead): :meth:`tripped_at` is the
        date to publish and store it with, so every gate and PostgreSQL agree."""
        scope = _scope_of(trip)
        cur = self.latest(scope, trip.detector.value)
        at = now_ms if cur is None else max(now_ms, cur.changed_at + 1)
        self.apply(StateChange(scope, trip.detector.value, HaltState.TRIPPED, at))

    def tripped_at(self, trip: Trip, now_ms: int) -> int:
        """The date :meth:`trip_now` gave ``trip`` (``now_ms`` if it is not tripped)."""
        cur = self.latest(_scope_of(trip), trip.detector.value)
        return cur.changed_at if cur is not None and cur.state is HaltState.TRIPPED else now_ms

    def tripped(self) -> list[Scope]:
        return sorted(self.halts)


def _scope_of(trip: Trip) -> Scope:
    return GLOBAL_SCOPE if trip.scope == "global" else (trip.scope, trip.key)


def refused(rec: BreakerStateRecord, now_ms: int) -> str | None:
    """Why a halt change read from the control topic is not honoured, or None."""
    if rec["detector"] not in _DETECTORS:
        return "unknown_detector"
    if rec["changed_at"] > now_ms + CONTROL_AHEAD_MS:
        return "dated_ahead"
    return None


def read_change(rec: BreakerStateRecord, global_key: str, now_ms: int) -> StateChange | str | None:
    """What a control-topic record asks of a reader (a gate or an agent): the change to
    honour, the reason it is refused (:func:`refused`), or None when it is another
    deployment's global scope. ValueError: a state that is neither tripped nor closed."""
    state = HaltState(rec["state"])
    scope = core_scope(rec["scope"], rec["scope_key"], global_key)
    if scope is None:
        return None
    why = refused(rec, now_ms)
    return why if why is not None else StateChange(scope, rec["detector"], state,
                                                   rec["changed_at"])


def refusal(rec: BreakerStateRecord, why: str) -> str:
    """A refused record, for the log line."""
    return (f"anomaly control: state refused ({why}): {rec['scope']}/{rec['scope_key'][:80]} "
            f"{rec['detector'][:40]} {rec['state'][:20]} changed_at {rec['changed_at']}")


class StartRefusals(Generic[K]):
    """Refused changes to count, once each. While a reader reads the topic from its
    beginning (:meth:`begin` to :meth:`end`), a refusal counts only if it is still its
    key's latest change at the end: one that a later change of its key replaced was counted
    when it was first read, and must not count again at every start (the topic is
    compacted, not emptied). Outside that, a refusal counts at once."""

    def __init__(self) -> None:
        self._pending: dict[K, str] | None = None

    def begin(self) -> None:
        self._pending = {}

    def replaced(self, key: K) -> None:
        """A change of ``key`` was read: one refused before it no longer counts."""
        if self._pending is not None:
            self._pending.pop(key, None)

    def refused(self, key: K, reason: str) -> list[str]:
        """``key``'s change is refused for ``reason``: the reasons to count now."""
        if self._pending is None:
            return [reason]
        self._pending[key] = reason
        return []

    def end(self) -> list[str]:
        """Caught up: the refusals still current, to count once."""
        out, self._pending = list((self._pending or {}).values()), None
        return out
