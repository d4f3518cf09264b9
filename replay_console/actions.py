"""The console's replay and delivery mutations (endpoint actions: :mod:`.endpoints`),
shared by the web handlers, the JSON API and the CLI.

Every action checks the principal's right, refuses bad input with a :class:`ActionError`
(status 400/403/404/409/429 and a message for the person) before changing anything, and
writes ``audit_log`` rows (actor, time, before/after) in the same PostgreSQL transaction
as its own change.

**Replays** (:func:`create_replay`) never publish directly: they record a job and its
deliveries (``replay_jobs``/``replay_items``); the :class:`~replay_console.drain.Drainer`
publishes them to the first retry tier at a per-endpoint cap, each with its original
``delivery_id`` and idempotency key, ``trigger="manual"``, ``triggered_by`` = the actor,
and a ``replayed`` outcome — so a bulk replay of 10,000 drains at the cap and never
starves first attempts. Held, rejected, pending and suppressed deliveries are never
replayed (a held one is released by a reviewer; a pending one is still in flight).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from postbacks.core.override import Override, apply_override, override_diff
from postbacks.ids import new_id
from postbacks.settings import Settings
from replay_console.auth import Principal, may
from replay_console.endpoints import load_endpoint, save_endpoint
from replay_console.queries import DeliveryFilter, NotFound, count_deliveries, filter_sql
from replay_console.reach import TargetRefused, check_edit, check_reach, check_target
from replay_console.rules import ActionError, Lookup, audit, require

__all__ = [
    "RENDER_FAILED",
    "REPLAYABLE",
    "RERENDERABLE",
    "RERENDER_NOT_QUEUED",
    "ReplayJob",
    "create_replay",
    "eligibility",
    "job_status",
    "preview_edit",
    "redrivable",
    "replay_preview",
]

# Statuses a replay may re-drive: terminal ones (delivered too: "replay of already-delivered
# events"). A failing, quarantined, released or replayed delivery still has a live copy in
# the retry topics; replaying it would start a second chain beside it.
REPLAYABLE = ("delivered", "exhausted", "dead_lettered")
# A replay goes to an endpoint that is there, switched on and not disabled by the platform:
# otherwise the agent dead-letters it (unknown_endpoint) or parks it, and a delivered
# delivery would end dead-lettered or held for a replay that could not be sent. Counted
# as ``endpoint_off``; re-enable the endpoint first.
ENDPOINT_ON = ("EXISTS (SELECT 1 FROM endpoints e WHERE e.endpoint_id = {0}.endpoint_id"
               " AND e.enabled AND e.disabled_at IS NULL)")
# A re-render (fix once, re-render many) re-drives one endpoint's undelivered deliveries
# with its current config: exhausted, dead-lettered, and suppressed ones whose suppression
# is a render failure (``render_failed: ...``, written when the agent could not render it).
RERENDERABLE = ("suppressed", "exhausted", "dead_lettered")
RENDER_FAILED = "render_failed"
# A replay item (qi, of job qj) in flight: queued and not yet published by the drainer, or
# published less than an hour ago and its ``replayed`` outcome not yet in
# ``delivery_outcomes`` (until the sink records it, the delivery's status is still the one
# before the replay). After an hour without it (the sink down, the outcome lost) it no
# longer blocks another replay: the delivery could not be replayed again.
IN_FLIGHT = ("((qi.published_at IS NULL AND qj.state = 'queued')"
             " OR (qi.outcome_id IS NOT NULL AND qi.published_at > now() - interval '1 hour'"
             "     AND NOT EXISTS (SELECT 1 FROM delivery_outcomes o"
             "                     WHERE o.outcome_id = qi.outcome_id)))")
# ... and not already in flight in a replay
RERENDER_NOT_QUEUED = ("NOT EXISTS (SELECT 1 FROM replay_items qi JOIN replay_jobs qj"
                       " USING (job_id) WHERE qi.delivery_id = d.delivery_id"
                       f" AND {IN_FLIGHT})")


def redrivable(status: str | None, kind: str) -> bool:
    """Whether a delivery in ``status`` may be published by a replay job of ``kind`` (the
    drainer's re-check; a suppression, if any, is checked apart)."""
    return status in REPLAYABLE or (kind == "rerender" and status in RERENDERABLE)


def eligibility(status: str, sup_reason: str | None, sup_open: bool, rerender: bool
              ) -> tuple[bool, str]:
    """(may be replayed, the status it is counted under)."""
    if not rerender:
        shown = "suppressed" if sup_open else status
        return shown in REPLAYABLE, shown
    render_failed = sup_reason is not None and sup_reason.startswith(RENDER_FAILED)
    if render_failed and status in RERENDERABLE:
        return True, status
    if sup_open:
        return False, "suppressed"
    return status in RERENDERABLE and status != "suppressed", status

# --- replay -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ReplayJob:
    job_id: str
    total: int
    skipped: dict[str, int]  # status -> how many matched but may not be replayed
    diff: list[tuple[str, str, str]]  # edit-and-replay: what the override changes


def _rate_check(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
                per_app: dict[str, int]) -> None:
    limit = settings.console_replay_per_app_hour
    if limit == 0 or may(p, "unlimited_replay"):
        return
    used = dict(conn.execute(
        "SELECT i.app_id, count(*) FROM replay_items i JOIN replay_jobs j USING (job_id)"
        " WHERE i.app_id = ANY(%s) AND j.role <> 'admin'"
        " AND i.queued_at > now() - interval '1 hour' GROUP BY i.app_id", (list(per_app),),
    ).fetchall())
    for app, n in sorted(per_app.items()):
        left = max(0, limit - int(used.get(app, 0)))
        if n > left:
            raise ActionError(
                f"replay limit: {limit} deliveries per app per hour; app {app} has {left} "
                f"left this hour and this replay needs {n}", 429, app=app, left=left)


def create_replay(
    conn: psycopg.Connection[Any], settings: Settings, p: Principal, *,
    delivery_ids: Sequence[str] = (), flt: DeliveryFilter | None = None,
    override: Override | None = None, note: str | None = None, confirm: int | None = None,
    promote: bool = False, confirmation: str | None = None, lookup: Lookup | None = None,
    step_up_key: bytes | None = None, rerender: bool = False,
) -> ReplayJob:
    """Queue a replay of ``delivery_ids`` or of every delivery matching ``flt`` (bulk: more
    than ``console_bulk_confirm_above`` need ``confirm`` = the previewed count). With an
    ``override`` (edit & replay: one endpoint only, URL SSRF-checked), optionally promoted
    to the endpoint's config (admin, step-up for a URL). ``rerender`` (a filter naming one
    endpoint, no override): its :data:`RERENDERABLE` deliveries, suppressed render failures
    included, whose suppressions are resolved in the same transaction; the agent renders
    them with the endpoint's current config. Raises ActionError."""
    require(p, "replay", "replay deliveries")
    if bool(delivery_ids) == (flt is not None):
        raise ActionError("replay either delivery ids or a filter")
    if rerender and (flt is None or flt.endpoint is None or override is not None):
        raise ActionError("a re-render replays one endpoint's deliveries, without an edit")
    ids = list(dict.fromkeys(delivery_ids))
    if flt is not None:
        where, args = filter_sql(p, replace(flt, cursor=None), paging=False)
        kind = "rerender" if rerender else "bulk_replay"
        cap = settings.console_bulk_max
        if rerender:
            where += " AND d.status = ANY(%s) AND " + RERENDER_NOT_QUEUED
            args.append(list(RERENDERABLE))
            row = conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM deliveries d WHERE {where}"
                               " LIMIT %s) x", (*args, cap + 1)).fetchone()
            n = int(row[0]) if row else 0
        else:
            n = count_deliveries(conn, p, replace(flt, cursor=None), cap)
        if n > cap:
            raise ActionError(f"more than {cap} deliveries match; narrow the filter", 400)
    else:
        where, args = "d.delivery_id = ANY(%s)", [ids]
        kind = "edit_replay" if override else "replay"
        if len(ids) > settings.console_bulk_max:
            raise ActionError(f"at most {settings.console_bulk_max} ids per replay")
    # Serialised from here to commit: the replays already queued (below) and the per-app
    # limit are read as every earlier replay left them.
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_REPLAY_LOCK,))
    rows = conn.execute(
        "SELECT d.delivery_id, d.endpoint_id, d.app_id, d.status, d.created_at,"
        " s.delivery_id IS NOT NULL AND s.resolved_at IS NULL, s.reason,"
        f" {ENDPOINT_ON.format('d')} FROM deliveries d LEFT JOIN postback_suppressions s"
        "  ON s.delivery_id = d.delivery_id"
        f" WHERE {where} ORDER BY d.created_at, d.delivery_id", args,
    ).fetchall()
    queued = _queued(conn, settings.topic_prefix, [r[0] for r in rows])
    if ids:
        missing = sorted(set(ids) - {r[0] for r in rows})
        if missing:
            raise ActionError(f"no such delivery: {', '.join(missing[:10])}"
                              + (" ..." if len(missing) > 10 else ""), 404)
    ok: list[Any] = []
    skipped: dict[str, int] = {}
    for r in rows:
        eligible, status = eligibility(r[3], r[6], bool(r[5]), rerender)
        if eligible and r[0] in queued:  # a replay of it is waiting to be published
            eligible, status = False, "queued"
        elif eligible and not r[7]:
            eligible, status = False, "endpoint_off"
        if eligible:
            ok.append(r)
        else:
            skipped[status] = skipped.get(status, 0) + 1
    if ids and skipped:
        raise ActionError(
            "not replayable: " + ", ".join(f"{n} {s}" for s, n in sorted(skipped.items()))
            + " (only delivered, exhausted or dead-lettered deliveries are replayed: held ones"
            " are released by a reviewer; pending, failing, quarantined, released and replayed"
            " ones are still in flight; rejected and suppressed ones are never sent; queued"
            " ones already have a replay waiting to be published or not yet recorded;"
            " endpoint_off: the endpoint is deleted, switched off or disabled, so enable it"
            " first)", 409)
    if not ok and skipped.get("endpoint_off"):
        raise ActionError(f"{skipped['endpoint_off']} matching deliveries' endpoint is "
                          "deleted, switched off or disabled: enable it first; nothing was "
                          "replayed", 409)
    if not ok:
        raise ActionError("no replayable deliveries match; nothing was replayed", 404)
    diff: list[tuple[str, str, str]] = []
    if override is not None:
        endpoints = {r[1] for r in ok}
        if len(endpoints) != 1:
            raise ActionError("an edit applies to one endpoint's deliveries")
        ep = load_endpoint(conn, endpoints.pop())
        diff = override_diff(ep, override)
        if not diff:
            raise ActionError("the edit changes nothing compared with the endpoint's config")
        if override.url is not None:  # 403: where the role may send, before any lookup
            check_reach(p, ep, override.url)
        check_edit(p, ep, override)  # 403: what a support may not change
        edited = apply_override(ep, override)
        from postbacks.core.endpoint_check import endpoint_problems

        problems = endpoint_problems(edited, now_ms=int(time.time() * 1000),
                                     redact=False)  # (the endpoint's own, not this edit's)
        why = None
        if override.url is not None:
            why = check_target(override.url,
                                     allow_loopback=settings.allow_loopback_targets,
                                     lookup=lookup)
            if why:
                problems.append(why)
        if problems:  # audited when the URL's address is what is refused
            raise ActionError("edit refused: " + "; ".join(problems), 400,
                              audit=why is not None,
                              problems=problems)
    if kind in ("bulk_replay", "rerender") and len(ok) > settings.console_bulk_confirm_above \
            and confirm != len(ok):
        raise ActionError(
            f"{len(ok)} deliveries would be replayed: confirm with that count", 409,
            needs_confirmation=len(ok))
    per_app: dict[str, int] = {}
    for r in ok:
        per_app[r[2]] = per_app.get(r[2], 0) + 1
    _rate_check(conn, settings, p, per_app)
    if promote and override is not None:
        ep_id = ok[0][1]
        ep = load_endpoint(conn, ep_id)
        cfg = ep.config.to_json()
        if override.fields is not None:
            cfg["fields"] = list(override.fields)
        if override.aliases is not None:
            cfg["aliases"] = dict(override.aliases)
        problems = save_endpoint(conn, settings, p, ep_id, url=override.url, config=cfg,
                                       confirmation=confirmation, lookup=lookup,
                                       step_up_key=step_up_key,
                                       note=f"promoted from an edit & replay: {note or ''}")
        if problems:  # audited when the URL's address is what is refused, as above
            raise ActionError("promote refused: " + "; ".join(problems), 400,
                              audit=any(isinstance(x, TargetRefused) for x in problems))
    job_id = new_id("rpl", int(time.time() * 1000))
    selection: dict[str, Any] = ({"filter": flt.to_params()} if flt is not None
                                 else {"delivery_ids": ids})
    conn.execute(
        "INSERT INTO replay_jobs (job_id, topic_prefix, actor, role, kind, selection, override,"
        " note, total) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (job_id, settings.topic_prefix, p.actor, p.role, kind, Jsonb(selection),
         None if override is None else Jsonb(json.loads(override.to_json())), note, len(ok)),
    )
    # Interleave endpoints in seq order, so any window of pending items is a fair mix.
    by_ep: dict[str, list[Any]] = {}
    for r in ok:
        by_ep.setdefault(r[1], []).append(r)
    order: list[Any] = []
    queues = list(by_ep.values())
    i = 0
    while len(order) < len(ok):
        for q in queues:
            if i < len(q):
                order.append(q[i])
        i += 1
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO replay_items (job_id, seq, delivery_id, endpoint_id, app_id)"
            " VALUES (%s, %s, %s, %s, %s)",
            [(job_id, seq, r[0], r[1], r[2]) for seq, r in enumerate(order)],
        )
        if rerender:
            _resolve_render_failures(conn, p, [r[0] for r in ok if r[5]], job_id)
        after: dict[str, Any] = {"job_id": job_id, "kind": kind, "trigger": "manual"}
        if diff:
            after["override"] = {w: {"from": a, "to": b} for w, a, b in diff}
        cur.executemany(
            "INSERT INTO audit_log (actor, action, target_type, target_id, before, after,"
            " note) VALUES (%s, %s, 'delivery', %s, %s, %s, %s)",
            [(p.actor, f"delivery.{kind}", r[0], Jsonb({"status": r[3]}), Jsonb(after), note)
             for r in ok],
        )
    audit(conn, p, f"replay.{kind}", "replay_job", job_id, None,
           {"total": len(ok), "skipped": skipped, "selection": selection,
            **({"override": after["override"]} if diff else {})}, note)
    return ReplayJob(job_id, len(ok), skipped, diff)


def _resolve_render_failures(conn: psycopg.Connection[Any], p: Principal,
                             delivery_ids: list[str], job_id: str) -> None:
    """A re-render's suppressions (render failures) resolved, each audited."""
    if not delivery_ids:
        return
    done = conn.execute(
        "UPDATE postback_suppressions SET resolved_at = now(), resolved_by = %s"
        " WHERE delivery_id = ANY(%s) AND resolved_at IS NULL RETURNING delivery_id, reason",
        (p.actor, delivery_ids)).fetchall()
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO audit_log (actor, action, target_type, target_id, before, after,"
            " note) VALUES (%s, 'suppression.resolve', 'delivery', %s, %s, %s, NULL)",
            [(p.actor, d, Jsonb({"resolved": False, "reason": why}),
              Jsonb({"resolved": True, "by_replay": job_id})) for d, why in done])


_REPLAY_LOCK = 7_424_611_002  # serialises replay creation (queued replays, per-app limit)


def _queued(conn: psycopg.Connection[Any], topic_prefix: str, delivery_ids: list[str]
            ) -> set[str]:
    """Those of ``delivery_ids`` with a replay in flight (:data:`IN_FLIGHT`) for this
    deployment's topics: a second replay would re-drive them twice."""
    if not delivery_ids:
        return set()
    return {r[0] for r in conn.execute(
        "SELECT DISTINCT qi.delivery_id FROM replay_items qi JOIN replay_jobs qj"
        f" USING (job_id) WHERE qi.delivery_id = ANY(%s) AND qj.topic_prefix = %s AND {IN_FLIGHT}",
        (delivery_ids, topic_prefix))}


def preview_edit(conn: psycopg.Connection[Any], settings: Settings, p: Principal,
                 delivery_id: str, override: Override, *, lookup: Lookup | None = None,
                 ) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """An edit & replay's first step: the delivery and what the edit changes (URL
    SSRF-checked), nothing queued yet."""
    from replay_console.queries import delivery_detail

    require(p, "replay", "replay deliveries")
    d = delivery_detail(conn, p, delivery_id)
    ep = load_endpoint(conn, d["endpoint_id"])
    if override.url is not None:  # the role's checks before the URL's DNS lookup
        check_reach(p, ep, override.url)
    check_edit(p, ep, override)
    if override.url is not None:
        why = check_target(override.url, allow_loopback=settings.allow_loopback_targets,
                           lookup=lookup)
        if why:
            raise ActionError(f"edit refused: {why}", 400, audit=True)
    return d, override_diff(ep, override)


def replay_preview(conn: psycopg.Connection[Any], p: Principal, flt: DeliveryFilter,
                   settings: Settings) -> dict[str, Any]:
    """What a bulk replay of ``flt`` would re-drive: counts by status (replayable or not)
    and whether a confirmation is needed."""
    require(p, "replay", "replay deliveries")
    where, args = filter_sql(p, replace(flt, cursor=None), paging=False)
    cap = settings.console_bulk_max
    counts = dict(conn.execute(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM postback_suppressions s"
        "  WHERE s.delivery_id = x.delivery_id AND s.resolved_at IS NULL)"
        " THEN 'suppressed' WHEN x.status <> ALL(%s) THEN x.status"
        " WHEN EXISTS (SELECT 1 FROM replay_items qi JOIN replay_jobs qj USING (job_id)"
        f"  WHERE qi.delivery_id = x.delivery_id AND qj.topic_prefix = %s AND {IN_FLIGHT})"
        f" THEN 'queued' WHEN NOT {ENDPOINT_ON.format('x')} THEN 'endpoint_off'"
        " ELSE x.status END, count(*) FROM (SELECT d.delivery_id, d.endpoint_id, d.status"
        f" FROM deliveries d WHERE {where} LIMIT %s) x GROUP BY 1",
        (list(REPLAYABLE), settings.topic_prefix, *args, cap + 1),
    ).fetchall())
    replayable = sum(n for s, n in counts.items() if s in REPLAYABLE)
    return {"by_status": counts, "replayable": replayable, "replayable_statuses": REPLAYABLE,
            "needs_confirmation": replayable > settings.console_bulk_confirm_above,
            "too_many": sum(counts.values()) > cap, "filter": flt.to_params()}


def job_status(conn: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    row = conn.execute(
        "SELECT job_id, actor, kind, total, published, state, created_at, finished_at,"
        " (SELECT count(*) FROM replay_items i WHERE i.job_id = j.job_id"
        "  AND i.error IS NOT NULL) FROM replay_jobs j WHERE job_id = %s", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no replay job {job_id!r}")
    errors = [{"delivery_id": e[0], "error": e[1]} for e in conn.execute(
        "SELECT delivery_id, error FROM replay_items WHERE job_id = %s AND error IS NOT NULL"
        " ORDER BY seq LIMIT 100", (job_id,))] if row[8] else []
    return {"job_id": row[0], "actor": row[1], "kind": row[2], "total": row[3],
            "published": row[4] - int(row[8]), "not_published": int(row[8]),
            "not_published_examples": errors, "state": row[5],
            "created_at_ms": int(row[6].timestamp() * 1000),
            "finished_at_ms": None if row[7] is None else int(row[7].timestamp() * 1000)}


# --- suppress / resolve -----------------------------------------------------------------
