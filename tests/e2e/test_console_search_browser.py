"""Support's search and lists in a real browser (Debian's chromium, headless, driven by
Playwright with ``executable_path``), the console server as its own process over real
PostgreSQL:

- support pastes the webhook-id a publisher reports into the search box and lands on
  that one delivery; then narrows the list by error class and date;
- the dead-letters page pages through a filtered list with next/previous links and shows
  the count per reason;
- every page loads under the strict Content-Security-Policy with no violation.

Screenshots are saved under ``artifacts/console/``.
"""

from __future__ import annotations

import datetime as dt

from playwright.sync_api import sync_playwright

from postbacks.core.endpoint import EndpointConfig
from postbacks.db.connect import connect
from postbacks.db.endpoints import upsert_endpoint
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json
from tests.e2e.browser import CHROMIUM, FLAGS, shot
from tests.integration.anomaly_helpers import held_delivery, insert_deliveries
from tests.integration.console_util import token


def _seed(settings: Settings, ns: str) -> dict[str, str]:
    ep, app = f"ep_{ns}", f"app_{ns}"
    with connect(settings.database_url) as conn:
        upsert_endpoint(conn, endpoint_id=ep, app_id=app, url=f"https://pub.example/{ep}",
                        config=EndpointConfig())
        conn.commit()
    ds = [held_delivery(ns, n, endpoint=ep, app=app) for n in range(1, 6)]
    insert_deliveries(settings, ds, status="failing")
    now = dt.datetime.now(dt.UTC)
    with connect(settings.database_url) as conn:
        for n in range(1, 6):
            conn.execute("UPDATE deliveries SET last_error = %s WHERE delivery_id = %s",
                         ("http_5xx" if n % 2 else "timeout", f"dlv_{ns}_{n}"))
        for i in range(7):
            conn.execute(
                "INSERT INTO dead_letters (dead_letter_id, reason, error_class, error_message,"
                " stage, origin_topic, origin_partition, origin_offset, endpoint_id,"
                " occurred_at) VALUES (%s, %s, 'DeadLetterError', 'http_404', 'agent',"
                " 'dispatch.v1', 0, %s, %s, %s)",
                (f"dl_{ns}_{i}", "permanent" if i < 4 else "exhausted", i, ep,
                 now - dt.timedelta(minutes=i)))
        conn.commit()
    return {"ep": ep, "app": app, "webhook_id": ds[2]["idempotency_key"]}


def test_support_finds_a_delivery_and_pages_dead_letters_in_a_real_browser(
        settings: Settings, stack: Stack, namespace: str) -> None:
    ns = namespace
    w = _seed(settings, ns)
    _, port = stack.start_listening(
        "console", "console", "serve", "--port", "{port}", "--no-drain",
        ready=lambda p: http_json(f"http://127.0.0.1:{p}/healthz"))
    base = f"http://127.0.0.1:{port}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_context().new_page()
            violations: list[str] = []
            page.on("console", lambda m: violations.append(m.text)
                    if "Content Security Policy" in m.text else None)
            page.goto(f"{base}/login")
            page.fill("input[name=token]", token(settings, f"sup-{ns}", "support"))
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/deliveries*")

            # the webhook-id a publisher reports finds that one delivery
            page.fill("#search input[name=q]", w["webhook_id"])
            page.click("#search button[type=submit]")
            page.wait_for_url(f"{base}/deliveries?q=*")
            rows = page.locator("#deliveries tbody tr")
            assert rows.count() == 1 and f"dlv_{ns}_3" in rows.first.inner_text()
            shot(page, "search-by-webhook-id")
            page.click(f"text=dlv_{ns}_3")
            page.wait_for_url(f"{base}/deliveries/dlv_{ns}_3")

            # error class and a date range narrow the list
            page.goto(f"{base}/deliveries?app={w['app']}")
            today = dt.datetime.now(dt.UTC).date().isoformat()
            page.fill("#filters input[name=error]", "timeout")
            page.fill("#filters input[name=since]", today)
            page.click("#filters button[type=submit]")
            page.wait_for_url(f"{base}/deliveries?*error=timeout*")
            listed = page.locator("#deliveries tbody").inner_text()
            assert f"dlv_{ns}_2" in listed and f"dlv_{ns}_4" in listed
            assert f"dlv_{ns}_1" not in listed and f"dlv_{ns}_3" not in listed

            # dead letters: filtered by endpoint, 3 a page, counts per reason
            page.goto(f"{base}/dead-letters?limit=3")
            page.fill("#filters input[name=endpoint]", w["ep"])
            page.click("#filters button[type=submit]")
            page.wait_for_url(f"{base}/dead-letters?*endpoint=*")
            page.goto(page.url + "&limit=3")
            assert "7 dead letter(s) match; showing 1 to 3" in page.locator("#total").inner_text()
            counts = page.locator("#by-reason").inner_text()
            assert "permanent\t4" in counts and "exhausted\t3" in counts
            seen: list[str] = []
            while True:
                seen += [t.split("\t")[1] for t in
                         page.locator("#dead-letters tr").all_inner_texts()[1:]]
                if page.locator("#next").count() == 0:
                    break
                page.click("#next")
                page.wait_for_load_state()
            assert seen == ["permanent"] * 4 + ["exhausted"] * 3
            shot(page, "dead-letters-paged")
            page.click("#previous")
            page.wait_for_url(f"{base}/dead-letters?*offset=3*")
            assert "showing 4 to 6" in page.locator("#total").inner_text()
            assert violations == [], violations
        finally:
            browser.close()
