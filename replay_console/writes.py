"""The console's actions: the state-changing requests (replay, edit & replay, suppress,
resolve a dead letter, release or reject held deliveries, save an endpoint, rotate its
secret, test-send). Each names its action (counted ``ok`` or ``refused``), checks the
principal's role, runs the action in :mod:`.actions` / :mod:`.endpoints` on the pool, and
answers JSON for the API or a redirect / page for the browser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from replay_console import actions as act
from replay_console import endpoints as eps
from replay_console import queries as q
from replay_console import reach
from replay_console import suppressions as sup
from replay_console.auth import issue_step_up, may
from replay_console.forms import (
    body_of,
    filter_from,
    flag,
    id_list,
    is_api,
    note_of,
    override_from,
    text,
    whole,
)
from replay_console.guard import json_text
from replay_console.http import (
    ACTION,
    REFUSED,
    Console,
    Handler,
    counted,
    doing,
    done,
    me,
    not_for_publishers,
)
from replay_console.problem import Problem
from replay_console.rules import ActionError, require

__all__ = ["endpoint_create", "endpoint_save", "import_backfill", "replay_bulk", "replay_one",
           "rerender",
           "resolve", "resolve_dl", "resolve_suppression", "rotate", "send_test", "suppress"]

def replay_one(c: Console) -> Handler:
    """Replay one delivery; with url/fields/aliases it is an edit & replay: the first POST
    (without ``confirm=1``) shows the diff, the second queues it."""
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        did = request.match_info["id"]
        doing(request, "replay")
        if not may(p, "replay"):  # before the body: a malformed one is refused as a 403 too
            raise Problem(403, f"a {p.role} may not replay deliveries")
        body = await body_of(request)
        override = override_from(body)
        note = note_of(body)
        promote = flag(body, "promote")
        confirmed = flag(body, "confirm") or is_api(request)
        if override:
            doing(request, "edit_replay")
        if override is not None and not confirmed:
            d, diff = await c.pool.run(lambda conn: act.preview_edit(
                conn, c.settings, p, did, override, lookup=c.lookup))
            # promoting a URL change: this page is its step-up confirmation
            confirmation = (issue_step_up(c.key, p, d["endpoint_id"], override.url.strip())
                            if promote and override.url and may(p, "edit_endpoint")
                            else "")
            return c.render(request, "delivery.html", d=d, diff=diff,
                            edit={"url": override.url or "", "confirmation": confirmation,
                                  "fields": ",".join(override.fields or ()),
                                  "aliases": json.dumps(dict(override.aliases))
                                  if override.aliases is not None else "",
                                  "note": note or "", "promote": promote})
        job = await c.pool.run(lambda conn: act.create_replay(
            conn, c.settings, p, delivery_ids=[did], override=override, note=note,
            promote=promote, confirmation=text(body, "confirmation"), lookup=c.lookup,
            step_up_key=c.key))
        return done(request, {"job_id": job.job_id, "total": job.total,
                              "diff": [list(x) for x in job.diff]},
                    f"/replays/{job.job_id}", status=202)
    return h


def replay_bulk(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        doing(request, "bulk_replay")
        if not may(p, "replay"):  # before the body: the filter's errors name internal
            raise Problem(403, f"a {p.role} may not replay deliveries")  # statuses
        body = await body_of(request)
        ids = id_list(body, "delivery_ids")
        if ids:
            doing(request, "replay")
        flt = None if ids else filter_from(body)
        job = await c.pool.run(lambda conn: act.create_replay(
            conn, c.settings, p, delivery_ids=ids, flt=flt, note=note_of(body),
            confirm=whole(body, "confirm"), lookup=c.lookup))
        return done(request, {"job_id": job.job_id, "total": job.total,
                              "skipped": job.skipped},
                    f"/replays/{job.job_id}", status=202)
    return h


def suppress(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        did = request.match_info["id"]
        doing(request, "suppress")
        require(p, "suppress", "suppress deliveries")  # before the body, as every write
        body = await body_of(request)
        await c.pool.run(lambda conn: sup.suppress_delivery(conn, p, did,
                                                            note_of(body, "reason") or ""))
        return done(request, {"suppressed": did}, f"/deliveries/{did}")
    return h


def resolve_dl(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        dl = request.match_info["id"]
        doing(request, "resolve_dead_letter")
        require(p, "suppress", "resolve dead letters")
        body = await body_of(request)
        await c.pool.run(lambda conn: sup.resolve_dead_letter(conn, p, dl, note_of(body)))
        return done(request, {"resolved": dl}, "/dead-letters")
    return h


def resolve_suppression(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        did = request.match_info["id"]
        doing(request, "resolve_suppression")
        require(p, "suppress", "resolve suppressions")
        body = await body_of(request)
        await c.pool.run(lambda conn: sup.resolve_suppression(conn, p, did,
                                                              note_of(body)))
        return done(request, {"resolved": did}, "/suppressions")
    return h


def rerender(c: Console) -> Handler:
    """Re-render and replay an endpoint's undelivered deliveries (a bulk replay)."""
    async def h(request: web.Request) -> web.StreamResponse:
        from replay_console.rerender import rerender_replay

        p = me(request)
        eid = request.match_info["id"]
        doing(request, "rerender")
        if not may(p, "replay"):
            raise Problem(403, f"a {p.role} may not replay deliveries")
        body = await body_of(request)
        job = await c.pool.run(lambda conn: rerender_replay(
            conn, c.settings, p, eid, confirm=whole(body, "confirm"), note=note_of(body)))
        return done(request, {"job_id": job.job_id, "total": job.total,
                              "skipped": job.skipped}, f"/replays/{job.job_id}", status=202)
    return h


def resolve(c: Console, kind: str) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        from replay_console.held import HeldError, NeedsConfirmation, resolve_held

        doing(request, f"held_{kind}")
        p = not_for_publishers(request)
        if not may(p, "resolve_held"):
            raise Problem(403, f"only a reviewer may release or reject held deliveries "
                          f"(you are {p.role})")
        body = await body_of(request)
        ids = id_list(body, "delivery_ids")
        kw = {k: text(body, k) for k in ("endpoint", "reason", "app")}
        try:
            r = await asyncio.to_thread(
                resolve_held, c.settings, kind=kind, actor=p.actor, note=note_of(body),
                delivery_ids=ids, endpoint=kw["endpoint"], reason=kw["reason"],
                app=kw["app"], all_=flag(body, "all"),
                confirm=whole(body, "confirm"), held_until_ms=whole(body, "held_until", 15))
        except NeedsConfirmation as exc:
            raise Problem(409, str(exc), needs_confirmation=exc.count) from exc
        except HeldError as exc:
            raise Problem(400 if exc.code == 2 else 409, str(exc)) from exc
        counted(request[ACTION], "ok")
        data = {"kind": r.kind, "delivery_ids": list(r.delivery_ids),
                "skipped": list(r.skipped), "limit_reached": r.limit_reached}
        if is_api(request):
            return web.json_response(data)
        return c.render(request, "resolved.html", r=data)
    return h


def _config_and_types(request: web.Request, body: Mapping[str, Any],
                      ) -> tuple[dict[str, Any] | None, list[str] | None]:
    """An endpoint form's or API body's ``config`` (a JSON object, or JSON text in a form)
    and ``event_types`` (a list in the API, comma-separated in a form); None when absent."""
    config = body.get("config")
    if isinstance(config, str):
        config = json_text(config, "config") if config.strip() else None
    if config is not None and not isinstance(config, dict):
        raise Problem(400, "config must be a JSON object")
    raw_types = body.get("event_types")
    if isinstance(raw_types, list) and is_api(request):
        return config, [str(t) for t in raw_types]
    listed = text(body, "event_types")
    return config, listed.split(",") if listed else None


def _audit_target_refused(request: web.Request, problems: list[str]) -> None:
    """A save refused for its URL's address is audited, as a refused test-send is."""
    refused = next((x for x in problems if isinstance(x, reach.TargetRefused)), None)
    if refused is not None:
        request[REFUSED] = refused


def endpoint_save(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        doing(request, "endpoint_save")
        require(p, "edit_endpoint", "change endpoint configuration")  # before reading input
        eid = request.match_info["id"]
        body = await body_of(request)
        config, types = _config_and_types(request, body)
        try:
            problems = await c.pool.run(lambda conn: eps.save_endpoint(
                conn, c.settings, p, eid, url=text(body, "url"), config=config,
                event_types=types,
                confirmation=text(body, "confirmation"), note=note_of(body),
                lookup=c.lookup, step_up_key=c.key))
        except ActionError as exc:
            if is_api(request) or "confirmation" not in exc.extra:
                raise
            # the page: the same change again, with its confirmation code, to confirm
            e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
            return c.render(request, "endpoint.html", status=409, e=e, problems=[],
                            sent=None, step_up={
                                "confirmation": exc.extra["confirmation"],
                                "url": exc.extra["url"], "config": body.get("config") or "",
                                "event_types": text(body, "event_types") or "",
                                "note": note_of(body) or "", "message": str(exc)})
        if problems:
            counted(request[ACTION], "refused")
            _audit_target_refused(request, problems)
            if is_api(request):
                return web.json_response({"error": "endpoint not saved", "problems": problems},
                                         status=422)
            e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
            return c.render(request, "endpoint.html", status=422, e=e, problems=problems,
                            sent=None)
        return done(request, {"saved": eid}, f"/endpoints/{eid}")
    return h


def rotate(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        doing(request, "rotate_secret")
        require(p, "edit_endpoint", "rotate signing secrets")  # before reading input
        eid = request.match_info["id"]
        body = await body_of(request)
        secret = text(body, "secret")
        if not secret:
            raise Problem(400, "secret is required (whsec_...)")
        overlap = whole(body, "overlap_s")
        sid = await c.pool.run(lambda conn: eps.add_secret(
            conn, c.settings, p, eid, secret,
            overlap_s=float(overlap if overlap is not None else 86400)))
        return done(request, {"secret_id": sid}, f"/endpoints/{eid}")
    return h


def send_test(c: Console) -> Handler:
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        doing(request, "test_send")
        eid = request.match_info["id"]
        if not may(p, "test_send"):
            raise Problem(403, f"a {p.role} may not test-send")
        body = await body_of(request)
        override = override_from(body)
        ep = await c.pool.run(lambda conn: eps.load_for_test_send(conn, c.settings, p, eid))
        if override is not None:  # 403 (audited): the role's reach and edit rights first
            if override.url is not None:
                reach.check_reach(p, ep, override.url)
            reach.check_edit(p, ep, override)
        c.test_sends.take(eid, p.token_id)  # 429 (audited) past the limits
        if override is not None and override.url is not None:  # then the DNS lookup
            why = await asyncio.to_thread(reach.check_target, override.url,
                                          allow_loopback=c.settings.allow_loopback_targets,
                                          lookup=c.lookup)
            if why:
                raise Problem(400, f"test-send refused: {why}", audit=True)
        sent = await eps.test_send(c.settings, ep, override=override, lookup=c.lookup,
                                   by=p.actor)

        await c.pool.run(lambda conn: eps.audit_test_send(conn, p, eid, sent))
        counted(request[ACTION], "ok" if sent["ok"] else "refused")
        if is_api(request):
            return web.json_response(sent)
        e = await c.pool.run(lambda conn: q.endpoint_detail(conn, p, eid))
        return c.render(request, "endpoint.html", e=e, problems=[], sent=sent)
    return h


def endpoint_create(c: Console) -> Handler:
    """Create an endpoint (admin): the edit's checks, a new signing secret shown once."""
    async def h(request: web.Request) -> web.StreamResponse:
        p = me(request)
        doing(request, "endpoint_create")
        if not may(p, "edit_endpoint"):
            raise Problem(403, f"a {p.role} may not create endpoints")
        body = await body_of(request)
        config, listed = _config_and_types(request, body)
        types = listed or ["*"]
        app_id, url = text(body, "app_id") or "", text(body, "url") or ""
        if not app_id or not url:
            raise Problem(400, "app_id and url are required")
        problems, created = await c.pool.run(lambda conn: eps.create_endpoint(
            conn, c.settings, p, app_id=app_id, url=url,
            provider=text(body, "provider") or "v3", event_types=types, config=config,
            name=text(body, "name") or "", note=note_of(body), lookup=c.lookup))
        if created is None:
            counted(request[ACTION], "refused")
            _audit_target_refused(request, problems)
            if is_api(request):
                return web.json_response({"error": "endpoint not created",
                                          "problems": problems}, status=422)
            return c.render(request, "endpoint_created.html", status=422, created=None,
                            problems=problems, form={k: text(body, k) or "" for k in (
                                "app_id", "url", "provider", "event_types", "config",
                                "name")})
        counted(request[ACTION], "ok")
        eid = created["endpoint_id"]
        out = {**created, "test_send": f"/api/v1/endpoints/{eid}/test-send"}
        if is_api(request):
            return web.json_response(out, status=201)
        return c.render(request, "endpoint_created.html", status=201, created=out,
                        problems=[], form={})
    return h


def import_backfill(c: Console) -> Handler:
    """Backfill import of legacy failed deliveries (:mod:`.backfill`): ``data`` (the CSV or
    JSONL text), ``format`` (csv, jsonl or auto) and ``dry_run``. The page shows the
    report with the text kept, so a dry run is followed by the real run; the API answers
    the report (200, or 422 when a line is invalid)."""
    async def h(request: web.Request) -> web.StreamResponse:
        from postbacks.core.backfill import sniff_format
        from replay_console.backfill import FORMATS, import_deliveries

        doing(request, "import_deliveries")
        p = not_for_publishers(request)
        if not may(p, "import"):
            raise Problem(403, f"a {p.role} may not import deliveries (reviewers and admins "
                          "may)")
        body = await body_of(request)
        data = body.get("data")
        if not isinstance(data, str) or not data.strip():
            raise Problem(400, "data: paste the CSV or JSONL lines to import")
        fmt = text(body, "format") or "auto"
        if fmt not in (*FORMATS, "auto"):
            raise Problem(400, f"format must be one of {', '.join(FORMATS)} or auto")
        chosen = sniff_format(None, data[:200]) if fmt == "auto" else fmt
        dry = flag(body, "dry_run")

        def run(conn: Any) -> dict[str, Any]:
            return import_deliveries(conn, c.settings, p, data, fmt=chosen, dry_run=dry,
                                     source="console").as_dict()

        report = await c.pool.run(run)
        counted(request[ACTION], "ok")
        status = 422 if report["counts"].get("invalid") else 200
        if is_api(request):
            return web.json_response(report, status=status)
        return c.render(request, "import.html", status=status, report=report, data=data,
                        fmt=fmt)
    return h

