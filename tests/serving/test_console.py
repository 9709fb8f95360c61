"""The web console in a real browser: headless Chromium (Debian's package) driven by Playwright.

Skipped, with the reason, where Chromium or Playwright is missing; nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import ARGS, CHROMIUM, skip_without_chromium
from tests.serving.conftest import Server

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
pytestmark = skip_without_chromium


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def remaining(page, scope: str, name: str) -> float:
    gauge = page.locator(f'#budget .gauge[data-scope="{scope}"][data-name="{name}"]')
    return float(gauge.get_attribute("data-remaining"))


def sign_in(page, server: Server, token: str) -> None:
    page.goto(server.url)
    page.fill("#token", token)
    page.click("#sign-in")
    page.wait_for_selector("#app:not([hidden])")


def test_analyst_signs_in_previews_runs_and_sees_the_chart(
    browser, server: Server, tmp_path: Path
) -> None:
    page = browser.new_page(viewport={"width": 1100, "height": 1300})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, server, server.alice)
    assert page.text_content("#who") == "alice (analyst)"
    page.wait_for_selector('#budget .gauge[data-scope="analyst"]')
    before = remaining(page, "analyst", "alice")
    page.fill("#epsilon", "0.25")
    sync_api.expect(page.locator("#cost")).to_contain_text("Costs ε=0.25")
    sync_api.expect(page.locator("#cost")).to_contain_text("analyst alice")
    page.click("#run")
    sync_api.expect(page.locator("#chart rect.bar")).to_have_count(5)
    sync_api.expect(page.locator("#chart line.error-bar")).to_have_count(15)
    sync_api.expect(page.locator("#results tbody tr")).to_have_count(5)
    assert page.locator("#results th").all_text_contents() == ["country", "n", "n_low", "n_high"]
    sync_api.expect(page.locator("#result-meta")).to_contain_text("95% intervals")
    page.wait_for_function(
        "before => Number(document.querySelector("
        "'#budget .gauge[data-scope=\"analyst\"]').dataset.remaining) < before",
        arg=before,
    )
    assert remaining(page, "analyst", "alice") == pytest.approx(before - 0.25)
    sync_api.expect(page.locator("#ledger tbody tr").first).to_contain_text("charge")
    page.screenshot(path=str(tmp_path / "console.png"), full_page=True)
    assert (tmp_path / "console.png").stat().st_size > 10_000

    page.fill("#epsilon", "500")
    sync_api.expect(page.locator("#cost")).to_contain_text("would be refused")
    page.click("#run")
    sync_api.expect(page.locator("#error")).to_contain_text("budget exceeded")
    assert remaining(page, "analyst", "alice") == pytest.approx(before - 0.25)
    assert errors == []


def test_schema_panel_prefills_and_inserts_columns(browser, server: Server) -> None:
    page = browser.new_page(viewport={"width": 1100, "height": 1300})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, server, server.bob)
    table = page.locator('#schema .table[data-table="requests"]')
    sync_api.expect(table).to_contain_text("privacy unit user_id")
    sync_api.expect(table).to_contain_text("country: public keys DK, NO, SE, FI, IS")
    sync_api.expect(table).to_contain_text("bytes: bounds [0, 100000]")
    assert page.locator("#schema .table").count() == 1  # the policy's tables only
    assert page.locator("#schema-defaults").text_content().startswith("Dataset demo: default ε 0.5")
    # pre-filled from the first policy table, with the policy's default epsilon
    expected = "SELECT country, COUNT(*) AS n FROM requests GROUP BY country"
    assert page.input_value("#sql") == expected
    assert page.input_value("#epsilon") == "0.5"
    # the cost preview shows the expected error EXPLAIN reports
    explained = server.call(
        "POST", "/v1/explain", server.bob, json={"sql": expected, "epsilon": 0.5}
    ).json()
    half = explained["expected_error"]["n"]
    sync_api.expect(page.locator("#cost")).to_contain_text(
        f"Expected error (95% interval): n ±{float(f'{half:.6g}'):g}"
    )
    # a click inserts a name at the cursor; the preview follows the edited query
    page.fill("#sql", "SELECT SUM() AS total FROM ")
    page.locator("#sql").evaluate("editor => editor.setSelectionRange(11, 11)")
    table.locator('button.column[data-insert="bytes"]').click()
    page.locator("#sql").evaluate("editor => editor.setSelectionRange(editor.value.length, 1e9)")
    table.locator('button.column[data-insert="requests"]').click()
    assert page.input_value("#sql") == "SELECT SUM(bytes) AS total FROM requests"
    sync_api.expect(page.locator("#cost")).to_contain_text("Expected error (95% interval): total ±")
    assert errors == []


def test_a_bad_token_is_refused(browser, server: Server) -> None:
    page = browser.new_page()
    page.goto(server.url)
    page.fill("#token", "dpsql_nope_nope")
    page.click("#sign-in")
    sync_api.expect(page.locator("#error")).to_contain_text("invalid or revoked token")
    assert page.locator("#app").is_hidden()


def test_auditor_sees_everything_and_verifies(browser, server: Server) -> None:
    page = browser.new_page()
    sign_in(page, server, server.auditor)
    assert page.locator("#query-panel").is_hidden()
    sync_api.expect(page.locator('#schema .table[data-table="requests"]')).to_have_count(1)
    sync_api.expect(page.locator('#budget .gauge[data-scope="analyst"]')).to_have_count(2)
    sync_api.expect(page.locator("#ledger tbody tr").last).to_contain_text("policy")
    page.click("#verify")
    sync_api.expect(page.locator("#verify-result")).to_contain_text("Verified")


def test_api_docs_render_without_a_cdn(browser, server: Server) -> None:
    page = browser.new_page()
    external: list[str] = []
    page.on(
        "request",
        lambda request: (
            None if request.url.startswith(server.url) else external.append(request.url)
        ),
    )
    page.goto(f"{server.url}/docs")
    sync_api.expect(page.locator(".opblock-summary-path", has_text="/v1/query")).to_have_count(1)
    assert external == []
