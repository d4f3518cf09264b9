"""The replay console in a real browser (Debian's chromium, headless, driven by Playwright
with ``executable_path`` — no browser download) over the whole pipeline: real Kafka,
PostgreSQL, every stage, the console server as its own process, a scripted receiver.

- support filters failed deliveries, opens one, edits its URL to a working receiver,
  replays — the receiver gets it with the original idempotency key;
- reviewer releases one held cohort (delivered with the original keys) and rejects
  another (never sent);
- publisher: held deliveries are absent from the page and from the API; once released and
  delivered they read like any delivered one (no hold, release or rejection shown);
- every page loads its stylesheet under the strict Content-Security-Policy, with no
  violation reported by the browser.

Screenshots are saved under ``artifacts/console/``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from playwright.sync_api import sync_playwright

from postbacks.db.anomaly import set_mode
from postbacks.db.connect import connect
from postbacks.emit import ConversionProducer
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, free_port, http_json, wait_for
from tests.e2e.browser import CHROMIUM, FLAGS, shot, sign_in
from tests.e2e.harness import Harness
from tests.integration.console_util import token
from tests.unit.factories import make_conversion

DAY_MS = 86_400_000




def _emit(settings: Settings, h: Harness, name: str, n: int, *, retrodated: bool) -> None:
    producer = ConversionProducer(settings)
    now = int(time.time() * 1000)
    for _ in range(n):
        h.sent += 1
        producer.send(make_conversion(
            event_id=f"evt_{h.sent}", conversion_id=f"cv_{h.namespace}_{h.sent}",
            app_id=h.app(name), occurred_at=now, source_created_at=now,
            source_completed_at=now - (30 * DAY_MS if retrodated else 1000)))
    assert producer.flush() == 0


def _keys(settings: Settings, endpoint_id: str) -> dict[str, str]:
    with connect(settings.database_url) as conn:
        return dict(conn.execute("SELECT delivery_id, idempotency_key FROM deliveries"
                                 " WHERE endpoint_id = %s", (endpoint_id,)).fetchall())


def _api(base: str, path: str, tok: str) -> Any:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"Bearer {tok}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_support_reviewer_and_publisher_in_a_real_browser(
        settings: Settings, stack: Stack, namespace: str) -> None:
    ns = namespace
    h = Harness(settings, stack, ns)
    h.start_receiver()
    eps = {name: h.endpoint(name) for name in ("broken", "cohort1", "cohort2", "fine")}
    h.script(eps["broken"], statuses=[404])
    fixed = f"{eps['broken']}_fixed"  # the working path support will point the replay at
    http_json(f"{h.base}/_control/secrets", {fixed: [h.secrets[eps["broken"]]]})
    with connect(settings.database_url) as conn:
        for name in ("cohort1", "cohort2"):
            set_mode(conn, scope="endpoint", scope_key=eps[name], detector="retrodating",
                     mode="enforce", actor="test")
        conn.commit()
    h.start_stages()
    port = free_port()
    stack.start("console", "console", "serve", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: http_json(f"{base}/healthz"), 30, what="console")

    _emit(settings, h, "broken", 3, retrodated=False)
    _emit(settings, h, "cohort1", 4, retrodated=True)
    _emit(settings, h, "cohort2", 3, retrodated=True)
    _emit(settings, h, "fine", 2, retrodated=False)
    h.wait_status(eps["broken"], "dead_lettered", 3)
    h.wait_status(eps["cohort1"], "held", 4)
    h.wait_status(eps["cohort2"], "held", 3)
    h.wait_status(eps["fine"], "delivered", 2)
    broken_keys = _keys(settings, eps["broken"])
    cohort1_keys = set(_keys(settings, eps["cohort1"]).values())

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            # --- publisher: held deliveries are not there, on the page or in the API ---
            pub_tok = token(settings, f"pub-{ns}", "publisher",
                            (h.app("cohort1"), h.app("fine")))
            page = browser.new_context().new_page()
            violations: list[str] = []
            page.on("console", lambda m: violations.append(m.text)
                    if "Content Security Policy" in m.text else None)
            sign_in(page, base, pub_tok)
            page.goto(f"{base}/deliveries?app={h.app('cohort1')}")
            assert page.locator("#deliveries tbody tr").first.inner_text().startswith(
                "No deliveries match")
            page.goto(f"{base}/deliveries")
            listed = page.locator("#deliveries tbody").inner_text()
            assert eps["fine"] in listed and eps["cohort1"] not in listed
            shot(page, "publisher-deliveries")
            # the stylesheet applied (served by the console, allowed by the policy)
            assert page.evaluate("getComputedStyle(document.querySelector('header'))"
                                 ".backgroundColor") == "rgb(31, 41, 55)"
            resp = page.goto(f"{base}/held")
            assert resp is not None and resp.status == 404
            assert "Not Found" in page.locator("#error-status").inner_text()
            page.click("#back")
            assert page.url.endswith("/deliveries")
            assert violations == [], violations
            api = _api(base, "/api/v1/deliveries?limit=200", pub_tok)["deliveries"]
            assert {d["endpoint_id"] for d in api} == {eps["fine"]}
            assert all(d["status"] != "held" for d in api)

            # --- support: filter failed, open one, edit its URL, replay ---
            page = browser.new_context().new_page()
            sign_in(page, base, token(settings, f"sup-{ns}", "support"))
            page.fill("#filters input[name=endpoint]", eps["broken"])
            page.select_option("#filters select[name=status]", "dead_lettered")
            page.click("#filters button[type=submit]")
            rows = page.locator("#deliveries tbody tr")
            assert rows.count() == 3
            shot(page, "support-failed-deliveries")
            rows.first.locator("a").first.click()
            delivery_id = page.locator("h1 code").inner_text()
            assert delivery_id in broken_keys
            assert page.locator("#idempotency-key").inner_text() == broken_keys[delivery_id]
            assert "404" in page.locator(".attempt legend").first.inner_text()
            page.fill("#edit-form input[name=url]", f"{h.base}/hooks/{fixed}")
            page.fill("#edit-form input[name=note]", "publisher moved their endpoint")
            page.click("#preview-edit")
            diff = page.locator("#edit-preview").inner_text()
            assert f"/hooks/{eps['broken']}" in diff and f"/hooks/{fixed}" in diff
            shot(page, "support-edit-diff")
            page.click("#confirm-edit-replay")
            page.wait_for_selector("#job")
            wait_for(lambda: [r for r in h.received(fixed)], 60, what="the edited replay")
            got = h.received(fixed)
            assert [r["idempotency_key"] for r in got] == [broken_keys[delivery_id]]
            wait_for(lambda: h.scalar(
                "SELECT status FROM deliveries WHERE delivery_id = %s",
                (delivery_id,)) == "delivered", 60, what="the replay's delivered outcome")
            page.goto(f"{base}/deliveries/{delivery_id}")
            assert page.locator("#status").inner_text() == "delivered"
            assert "manual" in page.locator(".attempt legend").last.inner_text()
            shot(page, "support-replayed-delivery")

            # --- reviewer: release one cohort, reject the other ---
            page = browser.new_context().new_page()
            sign_in(page, base, token(settings, f"rev-{ns}", "reviewer"))
            page.goto(f"{base}/held")
            shot(page, "reviewer-held-cohorts")
            # filtered by app through the page's form (a database holding more cohorts than
            # the page shows, as a shared test database does, leaves newer ones off it)
            page.fill("#held-filters input[name=app]", h.app("cohort1"))
            page.click("#held-filters button[type=submit]")
            assert page.locator("#held-filters input[name=app]").input_value() == \
                h.app("cohort1")
            row = page.locator(f"#cohorts tr[data-endpoint='{eps['cohort1']}']")
            row.locator("input[name=note]").first.fill("checked with finance")
            row.locator("button.release").click()
            assert "4 released" in page.locator("#resolved").inner_text()
            page.goto(f"{base}/held?app={h.app('cohort2')}")
            row = page.locator(f"#cohorts tr[data-endpoint='{eps['cohort2']}']")
            row.locator("button.reject").click()
            assert "3 rejected" in page.locator("#resolved").inner_text()
            shot(page, "reviewer-rejected")
        finally:
            browser.close()

    h.wait_status(eps["cohort1"], "delivered", 4)
    assert {r["idempotency_key"] for r in h.received(eps["cohort1"])} == cohort1_keys
    # the publisher: its released deliveries read like any delivered one
    mine = _api(base, f"/api/v1/deliveries?app={h.app('cohort1')}", pub_tok)["deliveries"]
    assert len(mine) == 4 and {d["status"] for d in mine} == {"delivered"}
    for d in mine:
        one = _api(base, f"/api/v1/deliveries/{d['delivery_id']}", pub_tok)
        assert not {o["kind"] for o in one["outcomes"]} & {"held", "released", "rejected"}
        assert "release" not in {a["trigger"] for a in one["attempts"]}
        assert not {"hold_reason", "held_at_ms"} & set(one)
    h.wait_status(eps["cohort2"], "rejected", 3)
    # A sentinel after the reject: once it arrives, nothing rejected was sent before it.
    _emit(settings, h, "cohort2", 1, retrodated=False)
    h.wait_status(eps["cohort2"], "delivered", 1)
    assert len(h.received(eps["cohort2"])) == 1
    assert h.scalar("SELECT count(*) FROM audit_log a JOIN deliveries d ON d.delivery_id ="
                    " a.target_id WHERE d.endpoint_id = ANY(%s) AND a.action IN"
                    " ('held.release', 'held.reject', 'delivery.edit_replay')",
                    ([eps["cohort1"], eps["cohort2"], eps["broken"]],)) == 8
