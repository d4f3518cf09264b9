"""Bad bytes never make the console answer 5xx: generated inputs (NUL bytes, invalid UTF-8,
lone surrogates, over-long values, wrong JSON types, nesting, huge numbers) in every path
segment, query parameter, form field, JSON body, bearer token, CSRF header and cookie, on
every route and method of the app (read from its router, so a new route is covered
without touching this test), as every role, against the real console and PostgreSQL.

Every example is sent once per role (no credential, publisher, support, reviewer, admin,
and a support session cookie with its CSRF token). State-changing bodies always carry an
``app`` of this test's namespace (or an invalid one), so no generated request selects
another test's deliveries.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_from_bytes

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from postbacks.core.endpoint import EndpointConfig
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from replay_console.web import make_app
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from tests.integration.console_util import Client, console_server, token

TOTAL_INPUTS = 10_000  # at least this many requests in all, spread over the routes
_PARAM = re.compile(r"\{(\w+)\}")


def _routes(settings: Settings) -> list[tuple[str, str]]:
    """Every (method, path template) the app serves, from its router."""
    app = make_app(settings)
    out: set[tuple[str, str]] = set()
    for route in app.router.routes():
        res = route.resource
        if res is None:
            continue
        canonical = res.canonical
        if res.__class__.__name__ == "StaticResource":
            canonical = canonical.rstrip("/") + "/{filename}"
        out.add((route.method, canonical))
    return sorted(out)


def _enc(v: str | bytes) -> str:
    raw = v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")
    return quote_from_bytes(raw, safe="")


NASTY: list[str] = [
    "", " ", "\x00", "a\x00b", "\udc80", "\ud800", "é", "\u202e", "\ufeff", "%", "%00",
    "%ff", "../..", "..%2f", "A" * 300, "B" * 5000, "9" * 25, "9" * 5000, "-1", "0", "1e999",
    "NaN", "Infinity", "true", "null", "[]", "{}", "held", "released", "rejected", "pending",
    "delivered", "*", "a b", "\r\n", "\t", "<script>x</script>", "'", '"', "\\",
    "2026-11-30", "0001-01-01", "9999-12-31T23:59:59+14:00", "1:x", "99999999999999999:x",
    "whsec_" + "A" * 43 + "=", "http://[::1]/", "http://127.0.0.1:9/x", "javascript:x",
    "pbc_", "¹²³", "\u0663", "\U0001d7d7",
]
# The inputs most likely to break a layer: NUL (PostgreSQL text), bytes that are not UTF-8
# (surrogates after decoding), over-long and non-ASCII digits.
BAD: list[str | bytes] = ["\x00", "a\x00b", "\udc80", "x\ud800", b"\xff", b"\xed\xa0\x80",
                          b"\xc3", "A" * 300, "9" * 5000, "²", "\u0660", "-0", "1" * 20]
FIELDS = ["note", "reason", "url", "fields", "aliases", "promote", "confirm", "confirmation",
          "delivery_ids", "filter", "override", "endpoint", "app", "status", "error", "since",
          "until", "all", "config", "event_types", "secret", "overlap_s", "token", "next",
          "csrf", "cursor", "limit", "actor", "action", "target", "target_type", "target_id",
          "window", "sort", "x"]


@dataclass(frozen=True)
class Case:
    params: dict[str, str | bytes]
    query: list[tuple[str | bytes, str | bytes]]
    body_kind: str  # none | form | json | raw
    form: list[tuple[str | bytes, str | bytes]]
    json_body: Any
    raw: bytes
    content_type: str
    auth_junk: bytes | None
    csrf_junk: bytes | None
    cookie_junk: bytes | None


def _strategies(ids: list[str]) -> Any:
    chars = st.characters(exclude_categories=())  # surrogates too
    text = st.one_of(st.sampled_from(NASTY + ids), st.text(chars, max_size=30),
                     st.text(chars, min_size=200, max_size=1500))
    bad = st.sampled_from(BAD)
    value: Any = st.one_of(bad, st.sampled_from(ids), text, st.binary(max_size=30))
    name: Any = st.one_of(st.sampled_from(FIELDS), st.sampled_from(FIELDS), bad, text,
                          st.binary(max_size=8))
    json_leaf = st.one_of(
        st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63 - 5),
        st.integers(max_value=-(2**70)), st.floats(), text, bad.map(
            lambda v: v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v))
    json_value = st.recursive(
        json_leaf, lambda c: st.one_of(st.lists(c, max_size=4),
                                       st.dictionaries(st.one_of(st.sampled_from(FIELDS), text),
                                                       c, max_size=4)),
        max_leaves=12)
    json_body = st.one_of(
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), text), json_value, max_size=6),
        json_value)
    raws = st.one_of(st.binary(max_size=200), st.sampled_from([
        b"[" * 20_000, b"{\"a\":" * 5000, b'{"note": "\\u0000"}', b'{"note": "\\udc80"}',
        b'{"confirm": 1e400}', b'{"overlap_s": ' + b"9" * 5000 + b"}", b'{"note": "\xff"}',
        b"note=%ff%fe", b"note=\xff\xfe", b"a=" + b"&a=" * 2000, b"x" * 70_000,
        b'{"delivery_ids": [[[[[[[[[[[]]]]]]]]]]]}', b'{"filter": {"since": {"a": 1}}}',
        b'{"override": {"url": ["x"], "fields": [1, null], "aliases": {"a": 1}}}',
        b'{"config": {"headers": {"\\u0000": 1}}}', b'{"event_types": [1, {}, null]}',
    ]))
    header_junk = st.one_of(st.none(), st.binary(min_size=1, max_size=60).filter(
        lambda b: b"\r" not in b and b"\n" not in b),
        st.sampled_from([b"\xff\xfe", "é".encode(), b"A" * 5000, b"\x00", b"pbc_\xed\xa0\x80"]))
    return st.builds(
        Case,
        params=st.fixed_dictionaries({k: st.one_of(st.sampled_from(ids), value)
                                      for k in ("id", "job", "filename")}),
        query=st.one_of(st.just([]), st.lists(st.tuples(name, value), max_size=5)),
        body_kind=st.sampled_from(["none", "form", "json", "json", "raw"]),
        form=st.lists(st.tuples(name, value), max_size=6),
        json_body=json_body,
        raw=raws,
        content_type=st.sampled_from(["application/json", "application/x-www-form-urlencoded",
                                      "text/plain", "multipart/form-data; boundary=x", ""]),
        auth_junk=st.one_of(st.none(), st.none(), header_junk),
        csrf_junk=st.one_of(st.none(), st.none(), header_junk),
        cookie_junk=st.one_of(st.none(), st.none(), st.none(), header_junk),
    )


def _safe_json(v: Any, app: str) -> Any:
    """The body with its app (and its filter's app) pinned to ``app``."""
    if isinstance(v, dict):
        v = dict(v)
        v["app"] = app
        if isinstance(v.get("filter"), dict):
            v["filter"] = {**v["filter"], "app": app}
    return v


class Sender:
    """Raw HTTP/1.1 on a kept-alive connection (reopened when the server closes it)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None
        self.sent = 0

    def send(self, method: str, path: str, headers: list[tuple[str, bytes]],
             body: bytes | None) -> tuple[int, str]:
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.conn.putrequest(method, path, skip_accept_encoding=True)
                for k, v in headers:
                    self.conn.putheader(k, v)
                if body is not None:
                    self.conn.putheader("Content-Length", str(len(body)))
                self.conn.endheaders(body)
                resp = self.conn.getresponse()
                text = resp.read().decode("utf-8", "replace")
                if resp.getheader("Connection", "").lower() == "close" or resp.will_close:
                    self.conn.close()
                    self.conn = None
                self.sent += 1
                return resp.status, text
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def test_no_generated_input_gets_a_5xx(settings: Settings, namespace: str) -> None:
    ns = namespace
    app_a, ep_a = f"app_{ns}_a", f"ep_{ns}_a"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep_a, app_id=app_a, url="http://127.0.0.1:9/x",
                        config=EndpointConfig())
        conn.commit()
    for n, status in ((1, "delivered"), (2, "held"), (3, "dead_lettered"), (4, "released")):
        insert_deliveries(settings, [held_delivery(ns, n, endpoint=ep_a, app=app_a)],
                          status=status)
    ids = [f"dlv_{ns}_{n}" for n in (1, 2, 3, 4)] + [ep_a, app_a, "console.css"]
    routes = _routes(settings)
    assert len(routes) >= 30, routes
    per_route = math.ceil(TOTAL_INPUTS / len(routes) / 6) + 1

    def loopback(_host: str) -> list[str]:
        return ["127.0.0.1"]  # every name resolves to loopback: refused, nothing leaves

    failures: list[str] = []
    statuses: dict[int, int] = {}
    start = time.monotonic()
    with console_server(settings, lookup=loopback) as port:
        roles = {r: token(settings, f"fuzz-{r}-{ns}", r, (app_a,) if r == "publisher" else ())
                 for r in ("publisher", "support", "reviewer", "admin")}
        browser = Client(port)
        browser.sign_in(token(settings, f"fuzz-cookie-{ns}", "support"))
        assert browser.cookie and browser.csrf
        sender = Sender(port)
        cases = _strategies(ids)

        def fuzz(method: str, template: str) -> None:
            @hsettings(max_examples=per_route, deadline=None, derandomize=True, database=None,
                       suppress_health_check=list(HealthCheck))
            @given(case=cases)
            def run(case: Case) -> None:
                path = _PARAM.sub(lambda m: _enc(case.params.get(m.group(1), "x")), template)
                if case.query:
                    path += "?" + "&".join(f"{_enc(k)}={_enc(v)}" for k, v in case.query)
                pin = app_a if len(path) % 2 else "not an app!"
                body: bytes | None = None
                ctype = case.content_type
                if method in ("POST", "PUT", "PATCH", "DELETE"):
                    if case.body_kind == "form":
                        pairs = [(k, v) for k, v in case.form if k != "app"] + [("app", pin)]
                        body = "&".join(f"{_enc(k)}={_enc(v)}" for k, v in pairs).encode()
                        ctype = "application/x-www-form-urlencoded"
                    elif case.body_kind == "json":
                        body = json.dumps(_safe_json(case.json_body, pin)).encode()
                        ctype = "application/json"
                    elif case.body_kind == "raw" and b"app" not in case.raw:
                        body = case.raw
                for role in ("anonymous", *roles, "cookie"):
                    headers: list[tuple[str, bytes]] = []
                    if ctype and body is not None:
                        headers.append(("Content-Type", ctype.encode()))
                    if role in roles:
                        headers.append(("Authorization",
                                        b"Bearer " + (case.auth_junk or roles[role].encode())))
                    elif case.auth_junk is not None:
                        headers.append(("Authorization", b"Bearer " + case.auth_junk))
                    if role == "cookie":
                        cookie = case.cookie_junk or (browser.cookie or "").encode()
                        headers.append(("Cookie", b"pb_session=" + cookie))
                        headers.append(("X-CSRF-Token",
                                        case.csrf_junk or (browser.csrf or "").encode()))
                    elif case.csrf_junk is not None:
                        headers.append(("X-CSRF-Token", case.csrf_junk))
                    status, text = sender.send(method, path, headers, body)
                    statuses[status] = statuses.get(status, 0) + 1
                    if status >= 500:
                        failures.append(f"{status} {role} {method} {path[:200]!r} "
                                        f"body={(body or b'')[:200]!r}: {text[:200]}")

            run()

        for method, template in routes:
            fuzz(method, template)
        sent = sender.sent
    wall = time.monotonic() - start
    print(f"console fuzz: {sent} inputs over {len(routes)} routes x 6 roles in {wall:.1f} s; "
          f"statuses {dict(sorted(statuses.items()))}")
    assert not failures, f"{len(failures)} answers were 5xx:\n" + "\n".join(failures[:30])
    assert sent >= TOTAL_INPUTS
