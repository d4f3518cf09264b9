"""Operational notifications: which pipeline facts become events, and when one is notified.

Pure: every function takes the records and ``now``; the notifier stage does the I/O.

* ``dead_letter.first``: a dead letter of a known endpoint. Every dead letter is a
  candidate; the (endpoint, kind, UTC hour) slot makes only the first of the hour one.
* ``breaker.open_long``: an endpoint whose deliveries have been quarantined by its breaker
  (a ``quarantined`` outcome whose reason starts with ``breaker``) continuously for at
  least ``open_long_ms``: the first such outcome starts the clock, a later one at least
  ``open_long_ms`` after it (with no delivered outcome and no silence longer than
  ``open_long_ms`` between) raises the event.
* ``anomaly.tripped``: a BreakerState that went to ``tripped``; ``endpoint_id`` is the
  scope key for scope ``endpoint``, null for a global trip.
* ``endpoint.disabled`` / ``endpoint.enabled`` are produced by others; the notifier only
  notifies them.

Aggregation: at most one notification per (endpoint, kind, UTC hour of the fact);
global events use the endpoint ``*``. An event's id is derived from the fact it comes
from, so a fact read again (a batch aborted after the slot was claimed) finds its own
claim and is notified, while a second fact for the same slot is aggregated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from postbacks.core.endpoint import Endpoint
from postbacks.core.identity import delivery_id, idempotency_key
from postbacks.ids import derived_id
from postbacks.records import (
    BreakerStateRecord,
    ConversionEvent,
    DeadLetterRecord,
    DeliveryRecord,
    OperationalEventRecord,
    OutcomeRecord,
)

__all__ = [
    "ANOMALY_TRIPPED",
    "BREAKER_OPEN_LONG",
    "DEAD_LETTER_FIRST",
    "GLOBAL",
    "HOUR_MS",
    "NOTIFIED_KINDS",
    "OWN_KINDS",
    "BreakerWatch",
    "SeenSlots",
    "Slot",
    "from_breaker_state",
    "from_dead_letter",
    "hour_of",
    "is_breaker_quarantine",
    "notification_conversion",
    "plan_notification",
    "slot_of",
]

DEAD_LETTER_FIRST = "dead_letter.first"
BREAKER_OPEN_LONG = "breaker.open_long"
ANOMALY_TRIPPED = "anomaly.tripped"
ENDPOINT_DISABLED = "endpoint.disabled"
ENDPOINT_ENABLED = "endpoint.enabled"
OWN_KINDS = frozenset({DEAD_LETTER_FIRST, BREAKER_OPEN_LONG, ANOMALY_TRIPPED})
"""Kinds the notifier produces itself (ignored when read back from operations.v1)."""
NOTIFIED_KINDS = OWN_KINDS | {ENDPOINT_DISABLED, ENDPOINT_ENABLED}
GLOBAL = "*"
HOUR_MS = 3_600_000
EVENT_TYPE_PREFIX = "operations."


def hour_of(ms: int) -> int:
    """The start (epoch ms) of the UTC hour holding ``ms``."""
    return ms - ms % HOUR_MS


@dataclass(frozen=True, slots=True)
class Slot:
    """One notification slot: at most one notification per endpoint, kind and hour."""

    endpoint_id: str  # GLOBAL for a global event
    kind: str
    hour_ms: int


def slot_of(event: OperationalEventRecord) -> Slot:
    return Slot(event["endpoint_id"] or GLOBAL, event["kind"], hour_of(event["occurred_at"]))


def _event(kind: str, endpoint_id: str | None, occurred_at: int, reason: str | None,
           detail: dict[str, str], *source: str | None) -> OperationalEventRecord:
    return OperationalEventRecord(
        event_id=derived_id("ops", kind, *source), kind=kind, endpoint_id=endpoint_id,
        app_id=None, occurred_at=occurred_at, reason=reason, actor=None, detail=detail,
    )


def from_dead_letter(dl: DeadLetterRecord, now_ms: int) -> OperationalEventRecord | None:
    """The ``dead_letter.first`` candidate of a dead letter; None when its endpoint is
    unknown (an undecodable record has no endpoint to tell)."""
    if not dl["endpoint_id"]:
        return None
    at = dl["occurred_at"] if dl["occurred_at"] > 0 else now_ms
    detail = {"dead_letter_id": dl["dead_letter_id"], "reason": dl["reason"],
              "stage": dl["stage"]}
    if dl["delivery_id"]:
        detail["delivery_id"] = dl["delivery_id"]
    return _event(DEAD_LETTER_FIRST, dl["endpoint_id"], at, dl["reason"], detail,
                  dl["dead_letter_id"])


def from_breaker_state(bs: BreakerStateRecord, now_ms: int) -> OperationalEventRecord | None:
    """``anomaly.tripped`` for a halt that tripped; None for any other state."""
    if bs["state"] != "tripped":
        return None
    at = bs["changed_at"] if bs["changed_at"] > 0 else now_ms
    endpoint_id = bs["scope_key"] if bs["scope"] == "endpoint" else None
    detail = {"scope": bs["scope"], "scope_key": bs["scope_key"], "detector": bs["detector"]}
    for name in ("observed_value", "baseline_value"):
        value = bs[name]
        if value is not None:
            detail[name] = repr(float(value))
    return _event(ANOMALY_TRIPPED, endpoint_id, at, bs["reason"], detail,
                  bs["scope"], bs["scope_key"], bs["detector"], str(at))


def is_breaker_quarantine(o: OutcomeRecord) -> bool:
    return o["kind"] == "quarantined" and (o["reason"] or "").startswith("breaker")


@dataclass(slots=True)
class _Open:
    since_ms: int
    last_ms: int
    raised: bool = False


class BreakerWatch:
    """Per endpoint, since when its breaker has been quarantining (from outcomes)."""

    def __init__(self, open_long_ms: int) -> None:
        if open_long_ms <= 0:
            raise ValueError("open_long_ms must be positive")
        self.open_long_ms = open_long_ms
        self._open: dict[str, _Open] = {}

    def observe(self, o: OutcomeRecord, now_ms: int) -> OperationalEventRecord | None:
        """Feed one outcome; returns ``breaker.open_long`` once per continuous open run."""
        ep = o["endpoint_id"]
        at = o["occurred_at"] if o["occurred_at"] > 0 else now_ms
        if o["kind"] == "delivered":
            self._open.pop(ep, None)
            return None
        if not is_breaker_quarantine(o):
            return None
        st = self._open.get(ep)
        if st is None or at - st.last_ms > self.open_long_ms:
            st = self._open[ep] = _Open(at, at)
        st.last_ms = max(st.last_ms, at)
        if st.raised or at - st.since_ms < self.open_long_ms:
            return None
        st.raised = True
        open_s = (at - st.since_ms) // 1000
        return _event(BREAKER_OPEN_LONG, ep, at, f"breaker open for {open_s} s",
                      {"open_since": str(st.since_ms), "open_s": str(open_s),
                       "quarantine_reason": o["reason"] or ""},
                      ep, str(st.since_ms))

    def unraise(self, endpoint_ids: Iterable[str]) -> None:
        """Their ``breaker.open_long`` was not sent after all (its batch was aborted and
        will be read again): raise it again when its outcome comes back."""
        for ep in endpoint_ids:
            st = self._open.get(ep)
            if st is not None:
                st.raised = False

    def prune(self, now_ms: int) -> None:
        """Forget endpoints quiet for longer than ``open_long_ms`` (bounded memory)."""
        for ep in [e for e, st in self._open.items() if now_ms - st.last_ms > self.open_long_ms]:
            del self._open[ep]

    def __len__(self) -> int:
        return len(self._open)


class SeenSlots:
    """Slots known to be taken (by this process or, as found in the table, another), so a
    flood is aggregated without a database round trip per record. Only the current and
    the previous hour are kept."""

    def __init__(self) -> None:
        self._taken: set[Slot] = set()

    def taken(self, slot: Slot) -> bool:
        return slot in self._taken

    def mark(self, slot: Slot) -> None:
        self._taken.add(slot)

    def forget(self, slots: Iterable[Slot]) -> None:
        """Not known taken after all (marked in a batch that was aborted)."""
        self._taken.difference_update(slots)

    def prune(self, now_ms: int) -> None:
        oldest = hour_of(now_ms) - HOUR_MS
        self._taken = {s for s in self._taken if s.hour_ms >= oldest}

    def __len__(self) -> int:
        return len(self._taken)


def _snapshot(event: OperationalEventRecord) -> dict[str, str]:
    snap: dict[str, str] = dict(event["detail"])
    fields: Mapping[str, object] = {
        "kind": event["kind"], "event_id": event["event_id"],
        "endpoint_id": event["endpoint_id"], "app_id": event["app_id"],
        "occurred_at": event["occurred_at"], "reason": event["reason"],
        "actor": event["actor"],
    }
    snap.update({k: "" if v is None else str(v) for k, v in fields.items()})
    return snap


def notification_conversion(event: OperationalEventRecord, owner_app_id: str) -> ConversionEvent:
    """The synthetic conversion an owner's notification is rendered from: event_type
    ``operations.<kind>``, conversion_id the event id, the event's fields (and its
    detail) in ``source_snapshot``."""
    return ConversionEvent(
        event_id=event["event_id"], conversion_id=event["event_id"], app_id=owner_app_id,
        event_type=EVENT_TYPE_PREFIX + event["kind"], goal_id=None, payout_usd_micros=None,
        source_created_at=None, source_completed_at=None, occurred_at=event["occurred_at"],
        source_snapshot=_snapshot(event), original_amount=None, original_currency=None,
        producer="notifier",
    )


def plan_notification(event: OperationalEventRecord, owner_app_id: str, notify: Endpoint,
                      *, idem_key: bytes, now_ms: int) -> DeliveryRecord:
    """The delivery to the owner's notify endpoint (keyed by it on dispatch.v1); its id and
    idempotency key are derived like any delivery's, so a re-send is the same delivery."""
    conv = notification_conversion(event, owner_app_id)
    ident = (notify.endpoint_id, conv["conversion_id"], conv["event_type"], None)
    return DeliveryRecord(
        delivery_id=delivery_id(*ident), endpoint_id=notify.endpoint_id,
        idempotency_key=idempotency_key(idem_key, *ident), conversion=conv,
        created_at=now_ms, attempt=0, trigger="initial", triggered_by=None, due_at=None,
        enqueued_at=now_ms, first_attempt_at=None, hold_reason=None, last_error=None,
    )
