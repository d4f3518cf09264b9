"""Fan-out: one conversion event -> one delivery per subscribed endpoint.

Pure: validation and planning take the event, the endpoints and ``now``; the stage runner
does the I/O. A conversion no endpoint subscribes to yields no delivery (that is not an
error). Re-fanning the same event yields the same delivery ids (identity is deterministic).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from postbacks.core.anomaly.detectors import MAX_PAYOUT_MICROS
from postbacks.core.endpoint import Endpoint
from postbacks.core.event_types import EVENT_TYPES
from postbacks.core.identity import delivery_id, idempotency_key
from postbacks.core.instants import MAX_FUTURE_MS, MAX_MS, MIN_OCCURRED_AT_MS
from postbacks.errors import InvalidRecord
from postbacks.records import ConversionEvent, DeliveryRecord

__all__ = ["MAX_FUTURE_MS", "MAX_ID_CHARS", "MAX_PAYOUT_MICROS", "MIN_OCCURRED_AT_MS",
           "REQUIRED_FIELDS", "ROUTABLE_APP_ID", "check_conversion", "plan_deliveries", "shown",
           "validate_conversion"]

REQUIRED_FIELDS = ("event_id", "conversion_id", "app_id", "event_type")


def validate_conversion(event: ConversionEvent) -> None:
    """Raise :class:`InvalidRecord` (reason ``missing_field``) for an unusable event."""
    missing = [f for f in REQUIRED_FIELDS if not str(event.get(f) or "").strip()]
    if missing:
        raise InvalidRecord(
            f"conversion {event.get('conversion_id')!r}: required field(s) missing or empty: "
            + ", ".join(missing),
            reason="missing_field",
        )
    if event.get("occurred_at", 0) <= 0:
        raise InvalidRecord("occurred_at must be a positive epoch-ms time", reason="missing_field")


def plan_deliveries(
    event: ConversionEvent, endpoints: Iterable[Endpoint], *, idem_key: bytes, now_ms: int
) -> list[DeliveryRecord]:
    out: list[DeliveryRecord] = []
    for ep in endpoints:
        if not ep.subscribes(event["app_id"], event["event_type"]):
            continue
        ident = (ep.endpoint_id, event["conversion_id"], event["event_type"], event["goal_id"])
        out.append(
            DeliveryRecord(
                delivery_id=delivery_id(*ident),
                endpoint_id=ep.endpoint_id,
                idempotency_key=idempotency_key(idem_key, *ident),
                conversion=event,
                created_at=now_ms,
                attempt=0,
                trigger="initial",
                triggered_by=None,
                due_at=None,
                enqueued_at=now_ms,
                first_attempt_at=None,
                hold_reason=None,
                last_error=None,
            )
        )
    return out


MAX_ID_CHARS = 200  # event_id, conversion_id, app_id, goal_id (as the backfill import)
_IDS = ("event_id", "conversion_id", "app_id", "goal_id")
# In an id, a control character (tab, newline, the unit separator ...) is no one's
# intent, and the derived ids join their parts with one (postbacks.ids).
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_TEXTS = ("event_id", "conversion_id", "app_id", "event_type", "goal_id", "original_amount",
          "original_currency", "producer")
# An id that differs from the one an endpoint was saved with only by what no one sees (a
# zero-width or direction mark, a trailing or non-breaking space) matched no endpoint, and
# the conversion reached no one without a trace.
_INVISIBLE = frozenset({"Cf", "Zl", "Zp"})
_CURRENCY = re.compile(r"[A-Z]{3}")  # ISO 4217
# An app id an endpoint can be saved with (the console's and the CLI's check): a
# conversion whose app_id is outside it can never be routed
ROUTABLE_APP_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}", re.ASCII)
_AMOUNT = re.compile(r"[0-9]{1,18}(\.[0-9]{1,18})?")


def _unseen(v: str) -> bool:
    """Whether ``v`` has a character no one sees, or whitespace at either end."""
    return v != v.strip() or any(unicodedata.category(c) in _INVISIBLE for c in v
                                 if not c.isascii())


def shown(value: str) -> str:
    """A value as an error message shows it: escaped, at most 60 characters."""
    text = repr(value)  # NUL and control characters escaped
    return text if len(text) <= 60 else text[:57] + "..."


def check_conversion(event: ConversionEvent, now_ms: int) -> None:
    """Raise :class:`InvalidRecord` (reason ``invalid_record``) naming every field of
    ``event`` that a later stage cannot handle (see the module docstring); pure."""
    problems: list[str] = []
    for f in _TEXTS:
        v = event.get(f)
        if isinstance(v, str) and "\x00" in v:
            problems.append(f"{f} holds a NUL character")
    snapshot = event.get("source_snapshot") or {}
    bad = [k for k, v in snapshot.items() if "\x00" in k or "\x00" in v]
    if bad:
        problems.append(f"source_snapshot {', '.join(shown(k) for k in bad[:3])}"
                        f"{' ...' if len(bad) > 3 else ''} hold(s) a NUL character")
    for f in _IDS:
        v = event.get(f)
        if isinstance(v, str) and len(v) > MAX_ID_CHARS:
            problems.append(f"{f} is {len(v):,} characters long (at most {MAX_ID_CHARS})")
        elif isinstance(v, str) and _CONTROL.search(v.replace("\x00", "")):
            problems.append(f"{f} {shown(v)} holds a control character")
        elif f == "app_id" and isinstance(v, str) and _unseen(v):  # (it routes)
            problems.append(f"{f} {ascii(v)[:80]} has whitespace at an end or an invisible "
                            "character (a zero-width, direction or line mark)")
    currency, amount = event.get("original_currency"), event.get("original_amount")
    if currency and not _CURRENCY.fullmatch(currency):
        problems.append(f"original_currency {shown(currency)} is not a three-letter ISO 4217 "
                        "code (e.g. EUR)")
    if amount and not _AMOUNT.fullmatch(amount):
        problems.append(f"original_amount {shown(amount)} is not a decimal number "
                        "(e.g. 12.50)")
    event_type = event.get("event_type")
    if event_type not in EVENT_TYPES:
        problems.append(f"event_type {shown(str(event_type))} is not a known event type "
                        f"(known: {', '.join(sorted(EVENT_TYPES))})")
    payout = event.get("payout_usd_micros")
    if isinstance(payout, int) and payout > MAX_PAYOUT_MICROS:
        problems.append(f"payout_usd_micros {payout} is over {MAX_PAYOUT_MICROS} "
                        "(USD 1,000,000 for one conversion)")
    elif isinstance(payout, int) and payout < 0:
        problems.append(f"payout_usd_micros {payout} is negative")
    for f in ("source_created_at", "source_completed_at"):
        v = event.get(f)
        if isinstance(v, int) and not 0 <= v <= MAX_MS:
            problems.append(f"{f} {v} is outside 1970-01-01 .. 9999-12-31 (epoch ms)")
        elif isinstance(v, int) and v < MIN_OCCURRED_AT_MS:  # (the guard saw no retrodating)
            problems.append(f"{f} {v} is before 2000-01-01T00:00:00Z: epoch seconds where "
                            "epoch milliseconds are expected?")
    at = event.get("occurred_at")
    if isinstance(at, int) and 0 < at < MIN_OCCURRED_AT_MS:
        problems.append(f"occurred_at {at} is before 2000-01-01T00:00:00Z: epoch seconds "
                        "where epoch milliseconds are expected?")
    elif isinstance(at, int) and at > now_ms + MAX_FUTURE_MS:
        problems.append(f"occurred_at {at} is more than {MAX_FUTURE_MS // 60_000} minutes "
                        f"ahead of the clock ({now_ms}): epoch microseconds or nanoseconds "
                        "where epoch milliseconds are expected, or a wrong clock?")
    if problems:
        raise InvalidRecord(f"conversion {shown(str(event.get('conversion_id')))}: "
                            + "; ".join(problems), reason="invalid_record")
