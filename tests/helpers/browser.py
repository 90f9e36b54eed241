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
def open_page(url: str, width: int = 1200) -> Iterator[Any]:
    """The page at `url` + "/" in a fresh headless Chromium (a Playwright page), in a window
    `width` pixels wide."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise AssertionError("the page test needs playwright: pip install -e '.[dev]'") from err
    assert shutil.which(CHROMIUM), "the page test needs Chromium: apt-get install -y chromium"
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(url + "/")
            yield page
        finally:
            browser.close()


def translate_on(page: Any, text: str, target: str | None = None, source: str | None = None) -> str:
    """Pick `source` and `target` (where given), type `text` and click Translate, as a user
    would; the translation shown, once the first sentence's heatmap is drawn."""
    page.wait_for_selector("#target option", state="attached")  # the languages are in
    page.evaluate("delete document.getElementById('heatmap').dataset.drawn")
    if source is not None:
        page.select_option("#source-lang", source)
    page.fill("#source", text)
    if target is not None:
        page.select_option("#target", target)
    page.click("#go")
    page.wait_for_function("document.getElementById('heatmap').dataset.drawn", timeout=30_000)
    return page.inner_text("#translation")


# Counts the canvas's pixels shaded by the heatmap (blue over the transparent canvas).
PAINTED_CELLS = """() => {
  const canvas = document.getElementById('heatmap');
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] > 0 && data[i + 2] > data[i] + 40) painted++;
  }
  return painted;
}"""
