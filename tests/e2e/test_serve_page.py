"""The page at GET / in a real headless Chromium: type a sentence, click, and the translation
and its cross-attention heatmap appear.

Needs the Python driver (`playwright`, in the dev extra) and the system's Chromium
(`apt-get install -y chromium`, /usr/bin/chromium; Playwright's own browser download is not
used). Missing either, the test fails saying which, rather than skipping.
"""

from __future__ import annotations

import shutil

import httpx
from helpers.serving import Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def test_page_translates_and_draws_the_heatmap(served: Server) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        raise AssertionError("the page test needs playwright: pip install -e '.[dev]'") from err
    assert shutil.which(CHROMIUM), "the page test needs Chromium: apt-get install -y chromium"
    sentence = "qb qc qd qf"
    expected = httpx.post(served.url + "/v1/translate", json={"text": [sentence]}).json()
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(served.url + "/")
            page.fill("#source", sentence)
            page.click("#go")
            page.wait_for_function(
                "document.getElementById('heatmap').dataset.drawn", timeout=30_000
            )
            shown = page.inner_text("#translation")
            rows = int(page.get_attribute("#heatmap", "data-drawn"))
            painted = page.evaluate(_PAINTED_CELLS)
        finally:
            browser.close()
    assert shown == expected["translations"][0]
    assert rows > 0 and painted > 0, "the heatmap canvas is blank"


# Counts the canvas's pixels that are neither white nor black: the heatmap's shaded cells.
_PAINTED_CELLS = """() => {
  const canvas = document.getElementById('heatmap');
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let painted = 0;
  for (let i = 0; i < data.length; i += 4) {
    const [r, g, b] = [data[i], data[i + 1], data[i + 2]];
    if (b === 255 && r < 250 && r === g) painted++;
  }
  return painted;
}"""
