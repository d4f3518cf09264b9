"""Support's and an admin's day in a real browser (Debian's chromium, headless, driven by
Playwright with ``executable_path``) over the whole pipeline: real Kafka, PostgreSQL,
every stage, the console server as its own process (draining replays), a scripted
receiver that checks signatures.

- fix once, re-render many: conversions to an endpoint whose URL template names a macro
  the snapshot cannot fill are suppressed as render failures; the admin fixes the URL on
  the endpoint's page (with the step-up confirmation), previews the re-render (they render
  now) and replays them — the receiver gets every one, signed, with its original
  idempotency key;
- support finds a delivery by its conversion id, delivery id and webhook-id;
- the endpoints list shows the endpoints; the admin creates one (an internal address is
  refused with the reason first), gets its secret once, and test-sends to it;
- a backfill import: a dry run reports every line and writes nothing; the real run
  imports the good lines as dead letters; one is replayed and delivered.

Screenshots are saved under ``artifacts/console/``.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from playwright.sync_api import Page, sync_playwright

from postbacks.core.identity import delivery_id
from postbacks.settings import Settings
from postbacks.tools.procs import Stack, http_json, wait_for
from tests.e2e.browser import CHROMIUM, FLAGS, shot, sign_in
from tests.e2e.harness import Harness
from tests.integration.console_util import token


def _c(received: dict[str, str]) -> str:
    """The conversion id a V2 GET carried in its query string."""
    return parse_qs(received["query"])["c"][0]


def _search(page: Page, base: str, value: str, expect: str) -> None:
    page.goto(f"{base}/deliveries")
    page.fill("#search input[name=q]", value)
    page.click("#search button[type=submit]")
    page.wait_for_url(f"{base}/deliveries?q=*")
    rows = page.locator("#deliveries tbody tr")
    assert rows.count() == 1, page.locator("#deliveries").inner_text()
    assert expect in rows.first.inner_text()


def test_rerender_after_a_macro_fix_search_endpoints_and_import_in_a_real_browser(
        settings: Settings, stack: Stack, namespace: str) -> None:
    ns = namespace
    h = Harness(settings, stack, namespace)
    h.start_receiver()
    fixed_url = f"{h.base}/hooks/ep_{ns}_fix?c={{conversion_id}}"
    ep = h.endpoint("fix", provider="v2", method="GET",
                    url=f"{h.base}/hooks/ep_{ns}_fix?c={{conversion_id}}&x={{no_such_macro}}")
    h.start_stages()
    _, port = stack.start_listening("console", "console", "serve", "--port", "{port}",
                                    ready=lambda p: http_json(f"http://127.0.0.1:{p}/healthz"))
    base = f"http://127.0.0.1:{port}"

    cohort = h.emit("fix", 3)
    h.wait_status(ep, "suppressed", 3, timeout=120)
    assert h.received(ep) == []
    assert h.scalar("SELECT count(*) FROM postback_suppressions WHERE endpoint_id = %s"
                    " AND reason LIKE 'render_failed%%' AND resolved_at IS NULL", (ep,)) == 3

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_context().new_page()
            violations: list[str] = []
            page.on("console", lambda m: violations.append(m.text)
                    if "Content Security Policy" in m.text else None)
            sign_in(page, base, token(settings, f"adm-{ns}", "admin"))

            # fix once: the URL template on the endpoint's page, confirmed by step-up
            page.goto(f"{base}/endpoints/{ep}")
            page.fill("input[name=url][size='70']", fixed_url)
            page.click("#save-endpoint")
            page.click("#confirm-url-change")
            page.wait_for_url(f"{base}/endpoints/{ep}")
            assert h.scalar("SELECT url FROM endpoints WHERE endpoint_id = %s",
                            (ep,)) == fixed_url

            # re-render many: the preview renders them now; the replay delivers them
            page.goto(f"{base}/endpoints/{ep}/rerender")
            counts = page.locator("#rerender-counts").inner_text()
            assert counts.split("\n")[-1].split("\t")[:3] == ["3", "3", "0"], counts
            shot(page, "rerender-after-fix")
            page.click("#confirm-rerender")
            page.wait_for_url(f"{base}/replays/*")
            h.wait_status(ep, "delivered", 3, timeout=120)
            got = h.received(ep)
            assert sorted(_c(r) for r in got) == sorted(cohort)
            assert {r["signature"] for r in got} == {"ok"}
            keys = h.scalar("SELECT array_agg(idempotency_key) FROM deliveries"
                            " WHERE endpoint_id = %s", (ep,))
            assert sorted(r["idempotency_key"] for r in got) == sorted(keys)
            assert h.scalar("SELECT count(*) FROM postback_suppressions WHERE endpoint_id = %s"
                            " AND resolved_at IS NULL", (ep,)) == 0

            # search by each id: conversion id, delivery id, webhook-id
            did = delivery_id(ep, cohort[1], "conversion", None)
            webhook_id = h.scalar("SELECT idempotency_key FROM deliveries WHERE"
                                  " delivery_id = %s", (did,))
            for value in (cohort[1], did, webhook_id):
                _search(page, base, value, did)
            shot(page, "search-by-id")

            # the endpoints list, then a new endpoint: refused first, then created
            page.goto(f"{base}/endpoints?app_id={h.app('fix')}")
            assert ep in page.locator("#endpoints tbody").inner_text()
            page.click("#new-endpoint summary")
            page.fill("#create-endpoint input[name=app_id]", h.app("new"))
            page.fill("#create-endpoint input[name=url]", "http://10.1.2.3/hook")
            page.click("#create-endpoint button[type=submit]")
            assert "Not created" in page.locator("div.error").inner_text()
            page.fill("#create-endpoint input[name=url]", f"{h.base}/hooks/new-{ns}")
            page.fill("#create-endpoint input[name=name]", "new one")
            page.click("#create-endpoint button[type=submit]")
            new_ep = page.locator("#created-endpoint").inner_text()
            secret = page.locator("#created-secret").inner_text()
            assert new_ep.startswith("ep_") and secret.startswith("whsec_")
            shot(page, "endpoint-created")
            http_json(f"{h.base}/_control/secrets", {f"new-{ns}": [secret]})
            page.click("#test-send")
            wait_for(lambda: len(h.received(f"new-{ns}")) == 1, 30, what="the test send")
            assert h.received(f"new-{ns}")[0]["signature"] == "ok"
            page.goto(f"{base}/endpoints?app_id={h.app('new')}")
            assert new_ep in page.locator("#endpoints tbody").inner_text()

            # backfill import: dry run, then the real run
            legacy = [{"legacy_id": f"fw_{ns}_{i}", "endpoint_id": ep,
                       "conversion_id": f"cv_{ns}_legacy_{i}", "event_type": "conversion",
                       "occurred_at": "2026-03-01T12:00:00+00:00", "payout_usd": "2.50",
                       "last_error": "timeout after 30 s"} for i in range(2)]
            text = "\n".join([*(json.dumps(x) for x in legacy),
                              json.dumps({**legacy[0], "legacy_id": "x", "endpoint_id":
                                          f"ep_{ns}_gone", "conversion_id": "cv_x"})])
            page.goto(f"{base}/import")
            page.fill("#import-data", text)
            page.click("#import-dry-run")
            assert "Dry run" in page.locator("#import-result").inner_text()
            assert page.locator("#import-counts .count-would_import").inner_text() == "2"
            assert page.locator("#import-counts .count-invalid").inner_text() == "1"
            assert "does not exist" in page.locator("#import-lines").inner_text()
            assert h.status_counts(ep).get("dead_lettered", 0) == 0
            shot(page, "import-dry-run")
            page.click("#import-run")
            assert page.locator("#import-counts .count-imported").inner_text() == "2"
            assert h.status_counts(ep).get("dead_lettered", 0) == 2
            shot(page, "import-real-run")

            # an imported delivery is driven like any dead letter
            page.click("#import-lines a >> nth=0")
            page.wait_for_url(f"{base}/deliveries/dlv_*")
            page.click("#replay")
            page.wait_for_url(f"{base}/replays/*")
            h.wait_status(ep, "delivered", 4, timeout=120)
            legacy_got = [r for r in h.received(ep) if _c(r).startswith(
                f"cv_{ns}_legacy_")]
            assert len(legacy_got) == 1 and legacy_got[0]["signature"] == "ok"
        finally:
            browser.close()
    assert violations == []
