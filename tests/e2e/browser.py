"""What the console's browser tests share: Debian's chromium driven by Playwright
(``executable_path``, no browser download), screenshots under ``artifacts/console/``,
and signing in with a console token."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "artifacts" / "console"
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def sign_in(page: Page, base: str, tok: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=token]", tok)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/deliveries*")
