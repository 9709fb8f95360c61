"""A report's HTML in a real browser: headless Chromium (Debian's package) driven by Playwright.

Skipped, with the reason, where Chromium or Playwright is missing; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsql.engine.report import run_report
from tests.browser import ARGS, CHROMIUM, skip_without_chromium
from tests.conftest import seeded_connect
from tests.engine.test_report import spec

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytestmark = skip_without_chromium


def test_the_report_renders_every_chart_with_error_bars_offline(
    demo_db: Path, rng, tmp_path: Path
) -> None:
    report = spec(**{'chart = "dot"': 'chart = "none"'})
    with seeded_connect(demo_db, analyst="bob", rng=rng) as session:
        done = run_report(session, report, tmp_path / "out")
    charted = [q.name for q in done.plan.queries if q.spec.chart != "none"]
    assert charted == ["by_country", "adults", "latency"]
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 1300})
            requests: list[str] = []
            errors: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto((tmp_path / "out" / "report.html").as_uri())
            figures = page.locator("figure.chart")
            assert [figures.nth(i).get_attribute("data-query") for i in range(3)] == charted
            assert figures.count() == 3
            for i in range(3):
                svg = figures.nth(i).locator("svg")
                box = svg.bounding_box()
                assert box is not None and box["width"] > 200 and box["height"] > 100
                # bars or points, and the error bars (a line collection per panel)
                assert svg.locator("[id^='LineCollection']").count() >= 1
            assert page.text_content("#verify-result") == "verified"
            assert page.locator("table.ledger tbody tr").count() == 1
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 50_000
            assert errors == []
            assert requests == [(tmp_path / "out" / "report.html").as_uri()]  # nothing fetched
        finally:
            browser.close()
