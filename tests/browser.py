"""Headless Chromium for browser tests: Debian's package driven by Playwright, never downloaded.

Test modules use ``CHROMIUM``/``ARGS`` with ``pytest.importorskip("playwright.sync_api")`` and
``skip_without_chromium`` so a machine without them skips with the reason.
"""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
skip_without_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)"
)
