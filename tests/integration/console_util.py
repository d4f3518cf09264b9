"""The console under test: the real aiohttp app on a real port (in a thread of this process,
so a DNS seam can be given), real PostgreSQL, real Kafka; and a small HTTP client that
keeps the session cookie and reads the CSRF token from the pages."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from postbacks.tools.procs import free_port
from replay_console.auth import create_token
from replay_console.pool import ConnPool
from replay_console.web import make_app

_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@contextmanager
def console_server(settings: Settings, lookup: Callable[[str], list[str]] | None = None,
                   pool: ConnPool | None = None) -> Iterator[int]:
    """Serve the console on a free port until the block ends; yields the port."""
    port = free_port()
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(settings, lookup=lookup, pool=pool), access_log=None)

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    t = threading.Thread(target=run, name="console", daemon=True)
    t.start()
    assert ready.wait(20), "console did not start"
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(20)


def token(settings: Settings, name: str, role: str, apps: tuple[str, ...] = ()) -> str:
    with connect(settings.database_url) as conn:
        _id, tok = create_token(conn, name=name, role=role, app_ids=apps, created_by="test")
        conn.commit()
    return tok


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Client:
    """Signs in with a bearer token (API) or a session cookie (pages, with CSRF)."""

    port: int
    bearer: str | None = None
    cookie: str | None = None
    csrf: str | None = field(default=None)

    def request(self, method: str, path: str, *, form: dict[str, Any] | None = None,
                body: Any = None, headers: dict[str, str] | None = None,
                raw: bytes | None = None) -> Reply:
        h = dict(headers or {})
        data: bytes | None = raw
        if form is not None:
            data = urlencode(form, doseq=True).encode()
            h["Content-Type"] = "application/x-www-form-urlencoded"
        elif body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        if self.bearer:
            h["Authorization"] = f"Bearer {self.bearer}"
        if self.cookie:
            h["Cookie"] = f"pb_session={self.cookie}"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=data, headers=h)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
            headers_out = {k.lower(): v for k, v in resp.getheaders()}
            for k, v in resp.getheaders():
                if k.lower() == "set-cookie" and v.startswith("pb_session="):
                    self.cookie = v.split(";")[0].split("=", 1)[1] or None
        finally:
            conn.close()
        m = _CSRF.search(text)
        if m:
            self.csrf = m.group(1)
        return Reply(resp.status, headers_out, text)

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Reply:
        return self.request("POST", path, **kw)

    def sign_in(self, tok: str) -> Reply:
        r = self.post("/login", form={"token": tok})
        assert r.status == 303, r.text
        self.get("/deliveries")  # picks up the CSRF token
        return r


def insert_dead_letter(settings: Settings, ns: str, endpoint_id: str) -> None:
    """Dead letter ``dl_{ns}``: delivery ``dlv_{ns}_5`` refused for good (an ``http_404``)."""
    with connect(settings.database_url) as conn:
        conn.execute("INSERT INTO dead_letters (dead_letter_id, reason, error_class,"
                     " error_message, stage, origin_topic, origin_partition, origin_offset,"
                     " delivery_id, endpoint_id, occurred_at) VALUES (%s, 'permanent',"
                     " 'DeadLetterError', 'http_404', 'agent', 'dispatch.v1', 0, 7, %s, %s,"
                     " now())", (f"dl_{ns}", f"dlv_{ns}_5", endpoint_id))
        conn.commit()


def endpoint_with_deliveries(settings: Settings, ns: str, name: str,
                             by_status: Mapping[str, Iterable[int]]) -> tuple[str, str]:
    """Endpoint ``ep_{ns}_{name}`` of app ``app_{ns}_{name}``, with deliveries
    ``dlv_{ns}_{n}`` in each status as the sink records them; (endpoint, app)."""
    from tests.integration.anomaly_helpers import held_delivery, insert_deliveries

    ep, app = f"ep_{ns}_{name}", f"app_{ns}_{name}"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=f"https://pub.example/{name}")
        conn.commit()
    for status, numbers in by_status.items():
        insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep, app=app) for n in numbers],
                          status=status)
    return ep, app
