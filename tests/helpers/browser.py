"""The serve page in a real headless Chromium, as a user meets it.

Needs the Python driver (`playwright`, in the dev extra) and the system's Chromium
(`apt-get install -y chromium`, /usr/bin/chromium; Playwright's own browser download is not
used). Missing either, a test fails saying which, rather than skipping.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@contextlib.contextmanager
def open_page(url: str) -> Iterator[Any]:
    """The page at `url` + "/" in a fresh headless Chromium (a Playwright page)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise AssertionError("the page test needs playwright: pip install -e '.[dev]'") from err
    assert shutil.which(CHROMIUM), "the page test needs Chromium: apt-get install -y chromium"
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(url + "/")
            yield page
        finally:
            browser.close()


def translate_on(page: Any, sentence: str, target: str | None = None) -> str:
    """Type `sentence`, pick `target` (if given) and click Translate, as a user would; the
    translation shown, once its heatmap is drawn."""
    page.evaluate("delete document.getElementById('heatmap').dataset.drawn")
    page.fill("#source", sentence)
    if target is not None:
        page.select_option("#target", target)
    page.click("#go")
    page.wait_for_function("document.getElementById('heatmap').dataset.drawn", timeout=30_000)
    return page.inner_text("#translation")
