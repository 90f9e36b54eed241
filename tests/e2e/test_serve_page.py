"""The page at GET / in a real headless Chromium, as a person meets it with one model: the
pair shown in its pickers, a paragraph typed and translated as the API translates it, each
sentence listed with its score and its attention heatmap drawn, the copy button, errors shown
in the page (`helpers.browser` says what the test needs). The page with several pairs is in
test_serve_routes.py.
"""

from __future__ import annotations

import httpx
from helpers.browser import PAINTED_CELLS, open_page, translate_on
from helpers.serving import Server

PARAGRAPH = "qb qc qd. qf qg qh!\nqj qk"


def test_page_translates_a_paragraph_and_draws_each_sentence(served: Server) -> None:
    body = {"text": [PARAGRAPH], "scores": True}
    expected = httpx.post(served.url + "/v1/translate", json=body, timeout=60).json()
    with open_page(served.url) as page:
        shown = translate_on(page, PARAGRAPH)
        listed = page.eval_on_selector_all("#sentences li", "items => items.length")
        rows = int(page.get_attribute("#heatmap", "data-drawn"))
        painted = page.evaluate(PAINTED_CELLS)
        pickers = [
            page.eval_on_selector_all(f"{select} option", "os => os.map(o => o.value)")
            for select in ("#source-lang", "#target")
        ]
        can_copy = page.is_enabled("#copy")
        swap = page.is_enabled("#swap")
        busy = page.get_attribute("body", "aria-busy")
    assert shown == expected["translations"][0]
    assert listed == len(expected["sentences"][0]) == 3
    assert rows > 0 and painted > 0, "the heatmap canvas is blank"
    assert pickers == [["xx"], ["yy"]]  # the one pair; nothing to detect, nothing to swap
    assert can_copy and not swap and busy == "false"


def test_errors_are_shown_in_the_page(served: Server) -> None:
    with open_page(served.url) as page:
        page.wait_for_selector("#target option", state="attached")
        page.click("#go")
        empty = page.inner_text("#error")
        page.fill("#source", "qb " * 1000)
        page.click("#go")
        page.wait_for_function("document.getElementById('error').textContent.includes('max')")
        too_long = page.inner_text("#error")
        still_usable = page.is_enabled("#go")
    assert "Type something" in empty
    assert "--max-chars 2000" in too_long and still_usable
