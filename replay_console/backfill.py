"""Backfill import: legacy failed deliveries into ``deliveries``, so the backlog is
drivable from the console (seed 000 §10 step 5).

:func:`import_deliveries` takes the file's text, parses it with
:mod:`postbacks.core.backfill`, and gives every line a verdict:

- ``invalid`` — the line cannot be used (the message names the field); nothing written;
- ``duplicate`` — an earlier line of the same file is the same delivery;
- ``exists`` — the delivery is already in the database (an earlier import, or fan-out
  made it): nothing written, which is what makes a re-run idempotent;
- ``would_import`` (dry run) / ``imported`` — a new delivery with status
  ``dead_lettered``, one ``delivery_outcomes`` row saying it was imported (with the legacy
  id and failure), the endpoint's idempotency key for its identity, and no attempts.

Every usable line is also rendered now with the endpoint's current config (the pure
renderer, nothing sent): ``renders`` says whether it would go out as it is. A line that
does not render is still imported; fix the endpoint, then re-render it from the
endpoint's page (fix once, re-render many). Imported deliveries are replayed like any
dead letter (console, ``postbacks deliveries replay``), through the relay's cap.

A real run writes everything in one transaction with one ``audit_log`` row
(``import_deliveries``: counts, the file's SHA-256, the actor). A dry run writes nothing.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.core.backfill import Candidate, LineError, parse_file
from postbacks.core.endpoint import Endpoint
from postbacks.core.identity import idempotency_key
from postbacks.db.delivery_keys import insert_keys
from postbacks.db.times import ts_of
from postbacks.ids import derived_id
from postbacks.settings import Settings
from replay_console.auth import Principal
from replay_console.rules import audit, require

__all__ = ["FORMATS", "ImportReport", "import_deliveries"]

FORMATS = ("csv", "jsonl")
_BATCH = 1000
Progress = Callable[[int], None]


@dataclass(slots=True)
class ImportReport:
    dry_run: bool
    fmt: str
    sha256: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    not_rendering: int = 0

    def add(self, line: dict[str, Any]) -> None:
        self.lines.append(line)
        self.counts[line["result"]] = self.counts.get(line["result"], 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "format": self.fmt, "sha256": self.sha256,
                "counts": dict(sorted(self.counts.items())),
                "not_rendering": self.not_rendering, "lines": self.lines}


class _Endpoints:
    """The endpoints the file names, loaded once each (enabled or not)."""

    def __init__(self, conn: psycopg.Connection[Any], settings: Settings) -> None:
        from postbacks.db.crypto import SecretBox

        self._conn = conn
        self._box = SecretBox(settings.secrets_key.reveal())
        self._cache: dict[str, Endpoint | None] = {}

    def get(self, endpoint_id: str) -> Endpoint | None:
        from postbacks.db.endpoints import load_endpoints

        if endpoint_id not in self._cache:
            found = load_endpoints(self._conn, self._box, only=endpoint_id)
            self._cache[endpoint_id] = found[0] if found else None
        return self._cache[endpoint_id]


def _check(c: Candidate, ep: Endpoint | None) -> str | None:
    if ep is None:
        return f"endpoint {c.endpoint_id} does not exist"
    if c.app_given and c.conversion["app_id"] != ep.app_id:
        return (f"app_id {c.conversion['app_id']!r} is not endpoint {c.endpoint_id}'s app "
                f"({ep.app_id!r})")
    return None


def _render_check(c: Candidate, ep: Endpoint, key: str, actor: str, now_ms: int
                  ) -> str | None:
    """None when the delivery renders with the endpoint's current config, else why not."""
    from postbacks.core.override import OverrideError
    from postbacks.core.render import RenderError, render
    from replay_console.held import redrive_record

    try:
        d = redrive_record(delivery_id=c.delivery_id, endpoint_id=c.endpoint_id,
                           idempotency_key=key, snapshot=dict(c.conversion),
                           created_at_ms=c.created_at_ms or now_ms, attempt=0,
                           trigger="manual", actor=actor, now_ms=now_ms)
        render(d, ep, now_ms=now_ms)
    except (RenderError, OverrideError, ValueError) as exc:
        return str(exc)[:500]
    return None


def _existing(conn: psycopg.Connection[Any], ids: list[str]) -> set[str]:
    out: set[str] = set()
    for i in range(0, len(ids), _BATCH):
        out.update(r[0] for r in conn.execute(
            "SELECT delivery_id FROM delivery_keys WHERE delivery_id = ANY(%s)",
            (ids[i:i + _BATCH],)))
    return out


def _reason(c: Candidate) -> str:
    why = f"imported from legacy failed delivery {c.legacy_id}"
    return why + (f": {c.last_error}" if c.last_error else "")


def _write(conn: psycopg.Connection[Any], rows: list[tuple[Candidate, Endpoint, str]],
           actor: str, now_ms: int) -> set[str]:
    """Insert the deliveries and their import outcomes; the ids actually inserted (a
    row another writer inserted meanwhile is left as it is)."""
    now = ts_of(now_ms)
    made: set[str] = set()
    for i in range(0, len(rows), _BATCH):
        batch = rows[i:i + _BATCH]
        created = {c.delivery_id: ts_of(c.created_at_ms) if c.created_at_ms else now
                   for c, _ep, _key in batch}
        new = insert_keys(conn, list(created.items()))  # the key first: one row per id
        batch = [x for x in batch if x[0].delivery_id in new]
        if not batch:
            continue
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO deliveries (delivery_id, endpoint_id, app_id, conversion_id,"
                " event_type, goal_id, event_id, idempotency_key, payout_usd_micros, snapshot,"
                " created_at, status, status_at, attempt_count, last_error)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 'dead_lettered', %s, 0,"
                " %s) ON CONFLICT DO NOTHING RETURNING delivery_id",
                [(c.delivery_id, c.endpoint_id, c.conversion["app_id"],
                  c.conversion["conversion_id"], c.conversion["event_type"],
                  c.conversion["goal_id"], c.conversion["event_id"], key,
                  c.conversion["payout_usd_micros"], Jsonb(dict(c.conversion)),
                  created[c.delivery_id], now,
                  (c.last_error or "imported")[:2000]) for c, _ep, key in batch],
                returning=True)
            inserted: set[str] = set()
            while True:
                row = cur.fetchone()
                if row is not None:
                    inserted.add(row[0])
                if not cur.nextset():
                    break
            cur.executemany(
                "INSERT INTO delivery_outcomes (outcome_id, delivery_id, endpoint_id, app_id,"
                " kind, attempt_no, payout_usd_micros, reason, actor, occurred_at)"
                " VALUES (%s, %s, %s, %s, 'dead_lettered', 0, NULL, %s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(derived_id("out", "backfill", c.delivery_id), c.delivery_id, c.endpoint_id,
                  c.conversion["app_id"], _reason(c)[:2000], actor, now)
                 for c, _ep, _key in batch if c.delivery_id in inserted])
        made |= inserted
    return made


def import_deliveries(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
                      text: str, *, fmt: str, dry_run: bool, source: str = "",
                      progress: Progress | None = None) -> ImportReport:
    """Validate (and unless ``dry_run``, import) the lines of ``text``; see the module
    doc. The caller commits (a dry run writes nothing to commit)."""
    require(p, "import", "import deliveries")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    report = ImportReport(dry_run=dry_run, fmt=fmt, sha256=digest)
    endpoints = _Endpoints(conn, settings)
    idem = settings.idempotency_key.reveal().encode()
    now_ms = int(time.time() * 1000)
    first_line: dict[str, int] = {}
    usable: list[tuple[Candidate, Endpoint, str, dict[str, Any]]] = []
    for n, item in enumerate(parse_file(text, fmt), start=1):
        if progress is not None and n % 5000 == 0:
            progress(n)
        if isinstance(item, LineError):
            report.add({"line": item.line, "result": "invalid", "legacy_id": item.legacy_id,
                        "message": item.message})
            continue
        ep = endpoints.get(item.endpoint_id)
        base = {"line": item.line, "legacy_id": item.legacy_id,
                "delivery_id": item.delivery_id, "endpoint_id": item.endpoint_id}
        problem = _check(item, ep)
        if problem is not None or ep is None:
            report.add({**base, "result": "invalid", "message": problem})
            continue
        if item.delivery_id in first_line:
            report.add({**base, "result": "duplicate",
                        "message": f"same delivery as line {first_line[item.delivery_id]}"})
            continue
        first_line[item.delivery_id] = item.line
        if not item.app_given:
            item.conversion["app_id"] = ep.app_id
        key = idempotency_key(idem, item.endpoint_id, item.conversion["conversion_id"],
                              item.conversion["event_type"], item.conversion["goal_id"])
        fails = _render_check(item, ep, key, p.actor, now_ms)
        line = {**base, "renders": fails is None, "render_error": fails}
        report.not_rendering += fails is not None
        usable.append((item, ep, key, line))
    present = _existing(conn, [c.delivery_id for c, _e, _k, _l in usable])
    new = [(c, e, k) for c, e, k, _l in usable if c.delivery_id not in present]
    inserted = set() if dry_run else _write(conn, new, p.actor, now_ms)
    for c, _e, _k, line in usable:
        if c.delivery_id in present or not (dry_run or c.delivery_id in inserted):
            report.add({**line, "result": "exists",
                        "message": "already in the database: nothing written"})
        else:
            report.add({**line, "result": "would_import" if dry_run else "imported"})
    report.lines.sort(key=lambda x: int(x["line"]))
    if not dry_run:
        audit(conn, p, "import_deliveries", "import", digest[:16], None,
              {"counts": report.counts, "format": fmt, "sha256": digest,
               "not_rendering": report.not_rendering}, source[:200] or None)
    return report
