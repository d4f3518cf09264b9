"""Fix once, re-render many: one endpoint's undelivered deliveries, rendered with its
*current* config, then re-driven.

:func:`rerender_preview` selects the endpoint's :data:`~replay_console.actions.RERENDERABLE`
deliveries (exhausted, dead-lettered, and suppressed render failures; not those a replay
has queued and not yet published) and renders each
one through the real, pure renderer (:func:`postbacks.core.render.render`: snapshot +
current config + signing secrets, no HTTP), saying per delivery whether it renders now and
the first lines of what would be sent. :func:`rerender_replay` queues them through
:func:`~replay_console.actions.create_replay` (``rerender=True``): the same cap, bulk
confirmation, per-app rate limit, audit rows and drainer as any bulk replay; their
render-failure suppressions are resolved in the same transaction. The agent renders them
again at send time, so a config that still fails makes them ``suppressed`` once more.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from postbacks.core.endpoint import Endpoint
from postbacks.settings import Settings
from replay_console.actions import (
    RENDER_FAILED,
    RERENDER_NOT_QUEUED,
    RERENDERABLE,
    ReplayJob,
    create_replay,
    eligibility,
)
from replay_console.auth import Principal
from replay_console.filters import ID, DeliveryFilter
from replay_console.queries import NotFound, filter_sql
from replay_console.rules import ActionError, require

__all__ = ["PREVIEW_SHOWN", "judge_rows", "preview_rows", "rerender_preview",
           "rerender_replay"]

PREVIEW_SHOWN = 50  # deliveries shown one by one (all of them are rendered and counted)
_LINES = 6
_CHARS = 600


def _excerpt(body: bytes) -> str:
    text = body.decode("utf-8", "replace")
    lines = text.splitlines()
    out = "\n".join(lines[:_LINES])
    if len(lines) > _LINES or len(out) > _CHARS:
        out = out[:_CHARS] + " ..."
    return out


def rerender_preview(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
                     endpoint_id: str) -> dict[str, Any]:
    """What a re-render of ``endpoint_id`` would re-drive, each delivery rendered now."""
    ep, rows = preview_rows(conn, settings, p, endpoint_id)
    return judge_rows(settings, p, ep, rows)


def preview_rows(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
                 endpoint_id: str) -> tuple[Endpoint, list[Any]]:
    """The endpoint and the rows :func:`judge_rows` renders (at most the bulk cap and one
    more). The console renders them after giving the connection back: rendering tens of
    thousands held one of its few connections for seconds."""
    from postbacks.db.crypto import SecretBox
    from postbacks.db.endpoints import load_endpoints

    require(p, "replay", "replay deliveries")
    if not ID.match(endpoint_id):
        raise NotFound(f"no endpoint {endpoint_id[:80]!r}")
    found = load_endpoints(conn, SecretBox(settings.secrets_key.reveal()), only=endpoint_id)
    if not found:
        raise NotFound(f"no endpoint {endpoint_id!r}")
    ep = found[0]
    cap = settings.console_bulk_max
    where, args = filter_sql(p, DeliveryFilter(endpoint=endpoint_id), paging=False)
    rows = conn.execute(
        "SELECT d.delivery_id, d.status, d.idempotency_key, d.snapshot, d.created_at,"
        " d.attempt_count, d.last_error, s.delivery_id IS NOT NULL AND s.resolved_at IS NULL,"
        " s.reason FROM deliveries d LEFT JOIN postback_suppressions s"
        "  ON s.delivery_id = d.delivery_id"
        f" WHERE {where} AND d.status = ANY(%s) AND {RERENDER_NOT_QUEUED}"
        " ORDER BY d.created_at, d.delivery_id LIMIT %s",
        (*args, list(RERENDERABLE), cap + 1)).fetchall()
    return ep, rows


def judge_rows(settings: Settings, p: Principal, ep: Endpoint,
               rows: list[Any]) -> dict[str, Any]:
    """Each row of :func:`preview_rows` rendered now: the counts, and the first
    :data:`PREVIEW_SHOWN` one by one."""
    from postbacks.core.override import OverrideError
    from postbacks.core.render import RenderError, render
    from replay_console.held import redrive_record

    endpoint_id = ep.endpoint_id
    cap = settings.console_bulk_max
    now_ms = int(time.time() * 1000)
    shown: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    renders = failing = 0
    for (did, status, key, snapshot, created_at, attempts, last_error, sup_open,
         sup_reason) in rows[:cap]:
        eligible, counted_as = eligibility(status, sup_reason, bool(sup_open), True)
        if not eligible:
            skipped[counted_as] = skipped.get(counted_as, 0) + 1
            continue
        item: dict[str, Any] = {"delivery_id": did, "status": status,
                                "render_failed": bool(sup_reason
                                                      and sup_reason.startswith(RENDER_FAILED)),
                                "suppression": sup_reason, "last_error": last_error}
        try:
            d = redrive_record(delivery_id=did, endpoint_id=endpoint_id, idempotency_key=key,
                               snapshot=dict(snapshot),
                               created_at_ms=int(created_at.timestamp() * 1000),
                               attempt=attempts, trigger="manual", actor=p.actor,
                               now_ms=now_ms)
            req = render(d, ep, now_ms=now_ms)
        except (RenderError, OverrideError, ValueError) as exc:
            failing += 1
            item.update(renders=False, error=str(exc))
        else:
            renders += 1
            item.update(renders=True, request={"method": req.method, "url": req.url,
                                               "header_names": sorted(req.headers),
                                               "body_excerpt": _excerpt(req.body)})
        if len(shown) < PREVIEW_SHOWN:
            shown.append(item)
    total = renders + failing
    return {"endpoint_id": endpoint_id, "provider": ep.provider, "url": ep.url,
            "replayable": total, "renders": renders, "still_failing": failing,
            "skipped": skipped, "deliveries": shown, "shown": len(shown),
            "needs_confirmation": total > settings.console_bulk_confirm_above,
            "too_many": len(rows) > cap, "statuses": RERENDERABLE}


def rerender_replay(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
                    endpoint_id: str, *, confirm: int | None = None, note: str | None = None,
                    ) -> ReplayJob:
    """Queue the re-render of ``endpoint_id``'s deliveries (see :func:`create_replay`)."""
    if not ID.match(endpoint_id):
        raise ActionError(f"no endpoint {endpoint_id[:80]!r}", 404)
    return create_replay(conn, settings, p, flt=DeliveryFilter(endpoint=endpoint_id),
                         confirm=confirm, note=note, rerender=True)
