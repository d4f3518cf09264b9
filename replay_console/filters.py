"""The console's delivery filter: query parameters (pages, API, CLI) -> a validated
:class:`DeliveryFilter`, or a :class:`FilterError` that names the bad parameter."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ID", "MAX_PAGE", "PUBLISHER_STATUSES", "STATUSES", "DeadLetterFilter",
           "DeliveryFilter", "FilterError", "parse_dead_letter_filter", "parse_filter",
           "parse_time"]

MAX_PAGE = 200
STATUSES = ("pending", "delivered", "failing", "exhausted", "dead_lettered", "quarantined",
            "held", "released", "rejected", "suppressed", "replayed")
# What a publisher may filter by and see: never a status that tells of a hold, a release
# or a rejection (nor pending: not yet sent).
PUBLISHER_STATUSES = tuple(s for s in STATUSES
                           if s not in ("pending", "held", "released", "rejected"))
ID = re.compile(r"^[A-Za-z0-9_.:*-]{1,200}$", re.ASCII)
ERROR_CLASS = re.compile(r"^[A-Za-z0-9_.-]{1,80}$", re.ASCII)
_CURSOR = re.compile(r"^([0-9]{1,16}):([A-Za-z0-9_.:-]{1,200})$")


class FilterError(ValueError):
    """A malformed filter, in words for the person who typed it (400)."""


@dataclass(frozen=True, slots=True)
class DeliveryFilter:
    app: str | None = None
    endpoint: str | None = None
    status: str | None = None
    error: str | None = None  # error class of the last attempt (deliveries.last_error)
    # one of the delivery's ids, exact: delivery id, conversion id or idempotency key (the
    # webhook-id the receiver sees is the idempotency key)
    q: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    cursor: tuple[int, str] | None = None  # (created_at ms, delivery_id) of the last row seen
    limit: int = 50

    def to_params(self) -> dict[str, str]:
        """The filter as query parameters (without the cursor), for links and previews."""
        out: dict[str, str] = {}
        for k in ("q", "app", "endpoint", "status", "error"):
            v = getattr(self, k)
            if v:
                out[k] = v
        if self.since_ms is not None:
            out["since"] = _iso(self.since_ms)
        if self.until_ms is not None:
            out["until"] = _iso(self.until_ms)
        return out


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_MIN_MS = 0  # 1970-01-01
_MAX_MS = 32_503_680_000_000  # 3000-01-01


def parse_time(name: str, raw: str, *, end_of_day: bool = False) -> int:
    """A date or an ISO-8601 time (no offset = UTC) -> epoch ms; a bare date is its
    midnight UTC, or the next midnight with ``end_of_day`` (an inclusive "to" date)."""
    text = raw.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            t = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
            if end_of_day:
                t += dt.timedelta(days=1)
        else:
            t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            if t.tzinfo is None:
                t = t.replace(tzinfo=dt.UTC)
        ms = int(t.timestamp() * 1000)
    except (ValueError, OverflowError):
        raise FilterError(f"{name} must be a date (2026-11-30) or an ISO time "
                          f"(2026-11-30T12:00:00Z), not {raw[:60]!r}") from None
    if not _MIN_MS <= ms < _MAX_MS:
        raise FilterError(f"{name} must be between 1970 and 3000")
    return ms


def parse_filter(params: Mapping[str, str], statuses: tuple[str, ...] = STATUSES
                 ) -> DeliveryFilter:
    """Query parameters → a filter; raises :class:`FilterError` naming the bad one.
    ``statuses``: the statuses an error names (what the asker may see; a publisher
    filtering by one it may not see gets an empty page, as for any status with no
    visible delivery)."""
    allowed = {"app", "endpoint", "status", "error", "error_class", "since", "until",
               "created_from", "created_to", "q", "cursor", "limit"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise FilterError(f"unknown filter(s): {', '.join(unknown)} "
                          f"(use {', '.join(sorted(allowed))})")
    kw: dict[str, Any] = {}
    for k in ("app", "endpoint", "error"):
        v = (params.get(k) or "").strip()
        if v:
            if not ID.match(v):
                raise FilterError(f"{k} {v[:60]!r} is not a valid id")
            kw[k] = v
    status = (params.get("status") or "").strip()
    if status:
        if status not in STATUSES:
            raise FilterError(f"status must be one of {', '.join(statuses)}")
        kw["status"] = status
    for k in ("since", "until"):
        v = (params.get(k) or "").strip()
        if v:
            kw[f"{k}_ms"] = parse_time(k, v)
    for k, alias, end in (("since", "created_from", False), ("until", "created_to", True)):
        v = (params.get(alias) or "").strip()
        if v:
            if f"{k}_ms" in kw:
                raise FilterError(f"give {alias} or {k}, not both")
            kw[f"{k}_ms"] = parse_time(alias, v, end_of_day=end)
    if (params.get("error_class") or "").strip():
        if kw.get("error") is not None:
            raise FilterError("give error_class or error, not both")
        v = params["error_class"].strip()
        if not ERROR_CLASS.match(v):
            raise FilterError(f"error_class {v[:60]!r} is not an error class (letters, "
                              "digits and _ . -, like http_5xx or timeout)")
        kw["error"] = v
    search = (params.get("q") or "").strip()
    if search:
        if not ID.match(search) or "*" in search:
            raise FilterError(f"q {search[:60]!r} is not an id (a delivery id, conversion "
                              "id, idempotency key or webhook-id)")
        kw["q"] = search
    if kw.get("since_ms") is not None and kw.get("until_ms") is not None \
            and kw["since_ms"] >= kw["until_ms"]:
        first = "created_from" if params.get("created_from", "").strip() else "since"
        last = "created_to" if params.get("created_to", "").strip() else "until"
        raise FilterError(f"{first} must be before {last}")
    cursor = (params.get("cursor") or "").strip()
    if cursor:
        m = _CURSOR.match(cursor)
        if not m:
            raise FilterError("cursor is malformed (use the next link of the previous page)")
        if not _MIN_MS <= int(m.group(1)) < _MAX_MS:
            raise FilterError("cursor is malformed (use the next link of the previous page)")
        kw["cursor"] = (int(m.group(1)), m.group(2))
    limit = (params.get("limit") or "").strip()
    if limit:
        if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= MAX_PAGE:
            raise FilterError(f"limit must be a whole number from 1 to {MAX_PAGE}")
        kw["limit"] = int(limit)
    return DeliveryFilter(**kw)


# --- dead letters -----------------------------------------------------------------------

MAX_OFFSET = 100_000  # deeper than this, narrow the filter (or the date range)
_WORD = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$", re.ASCII)


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """The dead-letters page's filter and page: stage, reason, endpoint, a date range on
    ``occurred_at``, resolved ones too (``all=1``), ``limit``/``offset``."""

    stage: str | None = None
    reason: str | None = None
    endpoint: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    unresolved: bool = True
    limit: int = 100
    offset: int = 0

    def to_params(self) -> dict[str, str]:
        """The filter as query parameters (without the page), for links."""
        out = {k: v for k in ("stage", "reason", "endpoint") if (v := getattr(self, k))}
        if self.since_ms is not None:
            out["created_from"] = _iso(self.since_ms)
        if self.until_ms is not None:
            out["created_to"] = _iso(self.until_ms)
        if not self.unresolved:
            out["all"] = "1"
        return out


def _whole(name: str, raw: str, low: int, high: int) -> int:
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise FilterError(f"{name} must be a whole number from {low} to {high}")
    return int(raw)


def parse_dead_letter_filter(params: Mapping[str, str]) -> DeadLetterFilter:
    """Query parameters -> a dead-letter filter; raises :class:`FilterError` naming the
    bad one."""
    allowed = {"stage", "reason", "endpoint", "created_from", "created_to", "all", "limit",
               "offset"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise FilterError(f"unknown filter(s): {', '.join(unknown)} "
                          f"(use {', '.join(sorted(allowed))})")
    kw: dict[str, Any] = {}
    for k in ("stage", "reason", "endpoint"):
        v = (params.get(k) or "").strip()
        if v:
            if not _WORD.match(v):
                raise FilterError(f"{k} {v[:60]!r} is not valid (letters, digits and _ . : -)")
            kw[k] = v
    for k, key, end in (("created_from", "since_ms", False), ("created_to", "until_ms", True)):
        v = (params.get(k) or "").strip()
        if v:
            kw[key] = parse_time(k, v, end_of_day=end)
    if "since_ms" in kw and "until_ms" in kw and kw["since_ms"] >= kw["until_ms"]:
        raise FilterError("created_from must be before created_to")
    flag = (params.get("all") or "").strip()
    if flag not in ("", "0", "1"):
        raise FilterError("all must be 1 (resolved ones too) or 0")
    kw["unresolved"] = flag != "1"
    if (v := (params.get("limit") or "").strip()):
        kw["limit"] = _whole("limit", v, 1, MAX_PAGE)
    if (v := (params.get("offset") or "").strip()):
        kw["offset"] = _whole("offset", v, 0, MAX_OFFSET)
    return DeadLetterFilter(**kw)
