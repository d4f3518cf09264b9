"""The console's delivery filter: query parameters (pages, API, CLI) -> a validated
:class:`DeliveryFilter`, or a :class:`FilterError` that names the bad parameter."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ID", "MAX_PAGE", "PUBLISHER_STATUSES", "STATUSES", "DeliveryFilter", "FilterError",
           "parse_filter"]

MAX_PAGE = 200
STATUSES = ("pending", "delivered", "failing", "exhausted", "dead_lettered", "quarantined",
            "held", "released", "rejected", "suppressed", "replayed")
# What a publisher may filter by and see: never a status that tells of a hold, a release
# or a rejection (nor pending: not yet sent).
PUBLISHER_STATUSES = tuple(s for s in STATUSES
                           if s not in ("pending", "held", "released", "rejected"))
ID = re.compile(r"^[A-Za-z0-9_.:*-]{1,200}$", re.ASCII)
_CURSOR = re.compile(r"^([0-9]{1,16}):([A-Za-z0-9_.:-]{1,200})$")


class FilterError(ValueError):
    """A malformed filter, in words for the person who typed it (400)."""


@dataclass(frozen=True, slots=True)
class DeliveryFilter:
    app: str | None = None
    endpoint: str | None = None
    status: str | None = None
    error: str | None = None  # error class of the last attempt (deliveries.last_error)
    since_ms: int | None = None
    until_ms: int | None = None
    cursor: tuple[int, str] | None = None  # (created_at ms, delivery_id) of the last row seen
    limit: int = 50

    def to_params(self) -> dict[str, str]:
        """The filter as query parameters (without the cursor), for links and previews."""
        out: dict[str, str] = {}
        for k in ("app", "endpoint", "status", "error"):
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


def _time(name: str, raw: str) -> int:
    text = raw.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            t = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
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
    allowed = {"app", "endpoint", "status", "error", "since", "until", "cursor", "limit"}
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
            kw[f"{k}_ms"] = _time(k, v)
    if kw.get("since_ms") is not None and kw.get("until_ms") is not None \
            and kw["since_ms"] >= kw["until_ms"]:
        raise FilterError("since must be before until")
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
