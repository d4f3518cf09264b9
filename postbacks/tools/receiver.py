"""A local postback receiver whose behaviour tests and the demo script, and which verifies
every signature with the ``standardwebhooks`` library (the receiver's side of the contract).

Postbacks arrive at ``/hooks/<endpoint_id>``. Control API (JSON):

- ``POST /_control/secrets``  ``{"<endpoint_id>": ["whsec_...", ...]}`` — secrets to verify with
- ``POST /_control/script``   ``{"<endpoint_id>" or "*": {"statuses": [500, 500, 200],
  "delay_ms": 0, "body": "ok", "headers": {"Retry-After": "3"}}}`` — the i-th request to
  the endpoint answers ``statuses[min(i, len-1)]`` (``"per_delivery": true``: the i-th request
  carrying the same webhook-id; ``"first_ids": n`` with it: only the endpoint's first n
  webhook-ids follow the statuses, every later one answers 200)
- ``GET /_control/stats`` — totals, unique webhook-ids, bad signatures, requests and unique
  webhook-ids per endpoint (``per_endpoint``, ``unique_per_endpoint``)
- ``GET /_control/received?endpoint=<id>`` — every request received (ids, headers, times)
- ``POST /_control/reset``
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from standardwebhooks import Webhook

from postbacks.cli_args import port

__all__ = ["ReceiverState", "build_app", "main"]


@dataclass
class Script:
    statuses: list[int] = field(default_factory=lambda: [200])
    per_delivery: bool = False  # index statuses by the n-th request of one webhook-id
    first_ids: int = 0  # with per_delivery: only the first n webhook-ids (0: all) follow it
    delay_ms: float = 0.0
    body: str = "ok"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ReceiverState:
    secrets: dict[str, list[str]] = field(default_factory=dict)
    scripts: dict[str, Script] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    seen: Counter[str] = field(default_factory=Counter)
    received: list[dict[str, Any]] = field(default_factory=list)
    ids: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    order: dict[str, list[str]] = field(default_factory=dict)  # webhook-ids, first seen first
    bad_signatures: int = 0
    unverified: int = 0

    def script_for(self, endpoint_id: str) -> Script:
        return self.scripts.get(endpoint_id) or self.scripts.get("*") or Script()

    def verify(self, endpoint_id: str, body: bytes, headers: dict[str, str]) -> str:
        secrets = self.secrets.get(endpoint_id) or self.secrets.get("*")
        if not secrets:
            self.unverified += 1
            return "unverified"
        for secret in secrets:
            try:
                Webhook(secret).verify(body, headers, json_parse=False)
                return "ok"
            except Exception:  # the library raises WebhookVerificationError
                continue
        self.bad_signatures += 1
        return "bad"


def build_app(state: ReceiverState | None = None) -> web.Application:
    st = state or ReceiverState()
    app = web.Application(client_max_size=4 * 1024 * 1024)

    async def hook(request: web.Request) -> web.Response:
        endpoint_id = request.match_info["endpoint_id"]
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        # a GET (provider v2) is signed over its request target: the values are in it
        signed = request.raw_path.encode() if request.method == "GET" else body
        signature = st.verify(endpoint_id, signed, headers)
        msg_id = headers.get("webhook-id", "")
        script = st.script_for(endpoint_id)
        n = st.seen[msg_id] if script.per_delivery else st.calls[endpoint_id]
        st.calls[endpoint_id] += 1
        st.seen[msg_id] += 1
        status = script.statuses[min(n, len(script.statuses) - 1)]
        if script.per_delivery and script.first_ids:
            order = st.order.setdefault(endpoint_id, [])
            if msg_id not in order:
                order.append(msg_id)
            if order.index(msg_id) >= script.first_ids:
                status = 200
        st.ids[endpoint_id].add(msg_id)
        st.received.append({
            "endpoint_id": endpoint_id, "webhook_id": msg_id, "at": time.time(),
            "attempt": headers.get("postback-attempt"), "status": status,
            "signature": signature, "idempotency_key": headers.get("idempotency-key"),
            "body": body.decode("utf-8", "replace"), "method": request.method,
            "query": request.query_string,
        })
        if script.delay_ms:
            await asyncio.sleep(script.delay_ms / 1000)
        return web.Response(status=status, text=script.body, headers=script.headers)

    async def set_secrets(request: web.Request) -> web.Response:
        data = await request.json()
        st.secrets.update({k: list(v) for k, v in data.items()})
        return web.json_response({"ok": True})

    async def set_script(request: web.Request) -> web.Response:
        data = await request.json()
        for key, spec in data.items():
            st.scripts[key] = Script(
                statuses=list(spec.get("statuses", [200])),
                per_delivery=bool(spec.get("per_delivery", False)),
                first_ids=int(spec.get("first_ids", 0)),
                delay_ms=float(spec.get("delay_ms", 0)),
                body=str(spec.get("body", "ok")),
                headers=dict(spec.get("headers", {})),
            )
        return web.json_response({"ok": True})

    async def stats(_request: web.Request) -> web.Response:
        unique = sum(len(v) for v in st.ids.values())
        return web.json_response({
            "received": len(st.received), "unique_ids": unique,
            "bad_signatures": st.bad_signatures, "unverified": st.unverified,
            "per_endpoint": dict(st.calls),
            "unique_per_endpoint": {k: len(v) for k, v in st.ids.items()},
        })

    async def received(request: web.Request) -> web.Response:
        ep = request.query.get("endpoint")
        rows = [r for r in st.received if ep is None or r["endpoint_id"] == ep]
        return web.Response(body=orjson.dumps(rows), content_type="application/json")

    async def reset(_request: web.Request) -> web.Response:
        st.scripts.clear()
        st.calls.clear()
        st.seen.clear()
        st.received.clear()
        st.ids.clear()
        st.order.clear()
        st.bad_signatures = st.unverified = 0
        return web.json_response({"ok": True})

    app.router.add_route("*", "/hooks/{endpoint_id}", hook)
    app.router.add_post("/_control/secrets", set_secrets)
    app.router.add_post("/_control/script", set_script)
    app.router.add_get("/_control/stats", stats)
    app.router.add_get("/_control/received", received)
    app.router.add_post("/_control/reset", reset)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="postbacks receiver",
        description="Run a scriptable local postback receiver that verifies signatures.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port, default=8787)
    args = parser.parse_args(argv)
    web.run_app(build_app(), host=args.host, port=args.port, access_log=None,
                print=lambda s: print(s, flush=True))
