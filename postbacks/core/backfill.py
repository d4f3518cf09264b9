"""Backfill import of legacy failed deliveries (seed 000 §10, step 5): pure parsing and
validation of a CSV or JSONL file into conversion snapshots, one verdict per line.

A line names the delivery it was (``legacy_id``, ``endpoint_id``) and the conversion it
came from (``conversion_id``, ``event_type``, optional ``goal_id``, ``app_id``, payout,
times, source snapshot). Every accepted line becomes a :class:`Candidate`: the
ConversionEvent the delivery is re-rendered from, with the endpoint's *current* config
and secrets when it is replayed (the legacy URL and body are never replayed byte for
byte: that is the old-URL/new-key skew the seed names). A line that cannot be used
becomes a :class:`LineError` naming the line and the field. Nothing here touches the
database; :mod:`replay_console.backfill` checks endpoints, renders, and writes.

Columns (CSV header names or JSONL keys; see docs/backfill.md):

- required: ``legacy_id``, ``endpoint_id``, ``conversion_id``, ``event_type``, and
  ``occurred_at`` (or ``source_created_at``, used when ``occurred_at`` is absent);
- optional: ``app_id`` (must be the endpoint's), ``goal_id``, ``event_id``,
  ``payout_usd_micros`` or ``payout_usd`` (a decimal), ``source_created_at``,
  ``source_completed_at``, ``original_amount``, ``original_currency``, ``created_at``
  (when the legacy delivery was created), ``last_error`` (the legacy failure, kept in the
  import outcome's reason);
- the source snapshot: a JSON object ``source_snapshot`` (JSONL; or a JSON string in
  CSV), or CSV columns ``snapshot.<field>``; values are kept as strings;
- ``legacy_*`` columns (e.g. ``legacy_url``, ``legacy_body``) are accepted and ignored.

Times are epoch milliseconds or ISO-8601 with an offset (:func:`parse_instant`). Any
other column is an error on the header (CSV) or on the line (JSONL), so a misspelt
``payout_usd_micro`` is not silently dropped.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from postbacks.core.anomaly.detectors import MAX_PAYOUT_MICROS
from postbacks.core.event_types import EVENT_TYPES
from postbacks.core.identity import delivery_id
from postbacks.core.instants import MIN_OCCURRED_AT_MS, InstantError, parse_instant
from postbacks.ids import derived_id
from postbacks.records import ConversionEvent

__all__ = ["COLUMNS", "MAX_ROWS", "Candidate", "LineError", "parse_file", "sniff_format"]

MAX_ROWS = 100_000  # one import; split bigger backlogs (re-runs are idempotent)
MAX_VALUE = 4096  # characters in one scalar field
MAX_SNAPSHOT_FIELDS = 200
REQUIRED = ("legacy_id", "endpoint_id", "conversion_id", "event_type")
OPTIONAL = ("app_id", "goal_id", "event_id", "payout_usd_micros", "payout_usd", "occurred_at",
            "source_created_at", "source_completed_at", "original_amount",
            "original_currency", "created_at", "last_error", "source_snapshot")
COLUMNS = REQUIRED + OPTIONAL
_TIMES = ("occurred_at", "source_created_at", "source_completed_at", "created_at")
_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$", re.ASCII)
_SNAP = "snapshot."
_LEGACY = "legacy_"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One usable line: the delivery it becomes and the conversion it renders from."""

    line: int
    legacy_id: str
    endpoint_id: str
    delivery_id: str
    conversion: ConversionEvent
    created_at_ms: int | None
    last_error: str | None
    app_given: bool  # app_id came from the file (checked against the endpoint's)


@dataclass(frozen=True, slots=True)
class LineError:
    line: int
    message: str
    legacy_id: str | None = None


def sniff_format(name: str | None, head: str) -> str:
    """``jsonl`` or ``csv``: from the file name's extension, else from the first
    non-blank character (``{`` is JSONL)."""
    low = (name or "").lower()
    if low.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if low.endswith(".csv"):
        return "csv"
    return "jsonl" if head.lstrip()[:1] == "{" else "csv"


def _text(value: Any, field: str) -> str | None:
    """A scalar field as clean text (None for absent/empty); ValueError names the field."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{field} must be a string, not {type(value).__name__}")
    s = str(value).strip()
    if not s:
        return None
    if len(s) > MAX_VALUE:
        raise ValueError(f"{field} is longer than {MAX_VALUE} characters")
    if "\x00" in s or any("\ud800" <= ch <= "\udfff" for ch in s):
        raise ValueError(f"{field} holds a NUL byte or bytes that are not UTF-8")
    return s


def _ident(value: Any, field: str, required: bool) -> str | None:
    s = _text(value, field)
    if s is None:
        if required:
            raise ValueError(f"{field} is required")
        return None
    if not _ID.match(s):
        raise ValueError(f"{field} {s[:80]!r} is not an id (letters, digits, _ . : -; "
                         "at most 200)")
    return s


def _micros(row: Mapping[str, Any]) -> int | None:
    raw, usd = row.get("payout_usd_micros"), _text(row.get("payout_usd"), "payout_usd")
    if raw not in (None, "") and usd is not None:
        raise ValueError("give payout_usd_micros or payout_usd, not both")
    if usd is not None:
        try:
            value = Decimal(usd) * 1_000_000
        except InvalidOperation:
            raise ValueError(f"payout_usd {usd[:40]!r} is not a decimal number") from None
        if not value.is_finite() or value != value.to_integral_value():
            raise ValueError(f"payout_usd {usd[:40]!r} has more than 6 decimal places")
        micros = int(value)
    else:
        s = _text(raw, "payout_usd_micros")
        if s is None:
            return None
        if not re.fullmatch(r"-?[0-9]{1,19}", s):
            raise ValueError(f"payout_usd_micros {s[:40]!r} is not a whole number of micros")
        micros = int(s)
    if micros < 0 or micros > MAX_PAYOUT_MICROS:
        raise ValueError("payout must be between 0 and 1,000,000 USD")
    return micros


def _instant(row: Mapping[str, Any], field: str) -> int | None:
    v = row.get(field)
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    try:
        return parse_instant(v.strip() if isinstance(v, str) else v, field)
    except InstantError as exc:
        raise ValueError(str(exc)) from None


def _snapshot(row: Mapping[str, Any]) -> dict[str, str]:
    snap: dict[str, str] = {}
    raw = row.get("source_snapshot")
    if isinstance(raw, str) and raw.strip():
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ValueError("source_snapshot is not a JSON object") from None
    if raw not in (None, ""):
        if not isinstance(raw, Mapping):
            raise ValueError("source_snapshot must be a JSON object")
        for k, v in raw.items():
            snap[str(k)] = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    for k, v in row.items():
        if k.startswith(_SNAP) and v not in (None, ""):
            snap[k[len(_SNAP):]] = str(v)
    if len(snap) > MAX_SNAPSHOT_FIELDS:
        raise ValueError(f"source_snapshot has more than {MAX_SNAPSHOT_FIELDS} fields")
    for k, v in snap.items():
        _text(k, "source_snapshot key")
        if len(v) > MAX_VALUE or "\x00" in v or any("\ud800" <= c <= "\udfff" for c in v):
            raise ValueError(f"source_snapshot.{k[:40]} is too long, or holds NUL or non-UTF-8")
    return snap


def _unknown(keys: list[str]) -> list[str]:
    return sorted(k for k in keys
                  if k not in COLUMNS and not k.startswith((_SNAP, _LEGACY)))


def candidate(line: int, row: Mapping[str, Any]) -> Candidate:
    """One row as a :class:`Candidate`; ValueError (naming the field) when it is unusable."""
    unknown = _unknown([str(k) for k in row])
    if unknown:
        raise ValueError(f"unknown column(s): {', '.join(repr(k[:40]) for k in unknown[:5])}")
    legacy = _ident(row.get("legacy_id"), "legacy_id", True)
    endpoint = _ident(row.get("endpoint_id"), "endpoint_id", True)
    conversion = _ident(row.get("conversion_id"), "conversion_id", True)
    event_type = _text(row.get("event_type"), "event_type")
    assert legacy is not None and endpoint is not None and conversion is not None
    if event_type is None:
        raise ValueError("event_type is required")
    if event_type not in EVENT_TYPES:
        raise ValueError(f"event_type {event_type[:40]!r} is not a known event type "
                         f"({', '.join(sorted(EVENT_TYPES))})")
    goal = _ident(row.get("goal_id"), "goal_id", False)
    app = _ident(row.get("app_id"), "app_id", False)
    times = {f: _instant(row, f) for f in _TIMES}
    occurred = times["occurred_at"] or times["source_created_at"]
    if occurred is None:
        raise ValueError("occurred_at is required (or source_created_at)")
    if occurred < MIN_OCCURRED_AT_MS:
        raise ValueError(f"occurred_at {occurred} is before 2000-01-01T00:00:00Z (epoch "
                         "seconds where epoch milliseconds are expected?)")
    event_id = _ident(row.get("event_id"), "event_id", False) or derived_id(
        "evt", "backfill", legacy)
    conv = ConversionEvent(
        event_id=event_id, conversion_id=conversion, app_id=app or "", event_type=event_type,
        goal_id=goal, payout_usd_micros=_micros(row),
        source_created_at=times["source_created_at"],
        source_completed_at=times["source_completed_at"], occurred_at=occurred,
        source_snapshot=_snapshot(row),
        original_amount=_text(row.get("original_amount"), "original_amount"),
        original_currency=_text(row.get("original_currency"), "original_currency"),
        producer="backfill",
    )
    return Candidate(line=line, legacy_id=legacy, endpoint_id=endpoint,
                     delivery_id=delivery_id(endpoint, conversion, event_type, goal),
                     conversion=conv, created_at_ms=times["created_at"],
                     last_error=_text(row.get("last_error"), "last_error"),
                     app_given=app is not None)


def _jsonl_rows(text: str) -> Iterator[tuple[int, Mapping[str, Any] | str]]:
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError as exc:
            yield n, f"not JSON: {exc}"
            continue
        except RecursionError:
            yield n, "not JSON this import takes: nested too deeply"
            continue
        yield n, row if isinstance(row, dict) else "a line must be one JSON object"


def _csv_rows(text: str) -> Iterator[tuple[int, Mapping[str, Any] | str]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return
    except csv.Error as exc:
        yield 1, f"the CSV header cannot be read: {exc}"
        return
    header = [h.strip() for h in header]
    bad = _unknown(header) + sorted({h for h in header if header.count(h) > 1})
    if bad or not header:
        yield 1, (f"header: unknown or repeated column(s) {', '.join(repr(h[:40]) for h in bad)}"
                  if bad else "header: empty")
        return
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield reader.line_num, f"the CSV cannot be read from here on: {exc}"
            return
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            yield reader.line_num, (f"{len(cells)} cells where the header has "
                                    f"{len(header)} columns")
            continue
        yield reader.line_num, dict(zip(header, cells, strict=True))


def parse_file(text: str, fmt: str) -> Iterator[Candidate | LineError]:
    """Every line of ``text`` (``csv`` or ``jsonl``) as a Candidate or a LineError, in file
    order; at most :data:`MAX_ROWS` data lines (one LineError says where it stopped)."""
    rows = _jsonl_rows(text) if fmt == "jsonl" else _csv_rows(text)
    seen = 0
    for n, row in rows:
        seen += 1
        if seen > MAX_ROWS:
            yield LineError(n, f"more than {MAX_ROWS} lines: import the rest in another run")
            return
        if isinstance(row, str):
            yield LineError(n, row)
            continue
        try:
            yield candidate(n, row)
        except ValueError as exc:
            legacy = row.get("legacy_id")
            yield LineError(n, str(exc), legacy[:200] if isinstance(legacy, str) else None)
