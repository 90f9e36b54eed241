"""The page at GET / in a real headless Chromium, as a person meets it: the pairs in its
pickers, a paragraph typed and translated as the API translates it, each sentence listed with
its score and its attention heatmap drawn, the copy button, errors shown in the page, and its
look on a desktop and a phone-width window (`helpers.browser` says what the test needs). The
page with several pairs is in test_serve_routes.py.

It serves the tiny test model; with ATTN_MT_PAGE_MODELS (run folders, separated by ':') it
serves those and types ATTN_MT_PAGE_TEXT, and with ATTN_MT_SCREENSHOTS (a folder) it keeps its
screenshots there: docs/serving.md's are made so (the command is there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.browser import PAINTED_CELLS, open_page, translate_on
from helpers.clirun import child_env
from helpers.serving import Server, start_server
from helpers.workspace import World

MODELS = os.environ.get("ATTN_MT_PAGE_MODELS")
TEXT = os.environ.get("ATTN_MT_PAGE_TEXT", "qb qc qd. qf qg qh!\nqj qk")
SHOTS = os.environ.get("ATTN_MT_SCREENSHOTS")


@pytest.fixture(scope="module")
def shown(request: pytest.FixtureRequest, world: World, tmp_path_factory) -> Iterator[Server]:
    """The server the page comes from: `served`, or one of ATTN_MT_PAGE_MODELS."""
    if not MODELS:
        yield request.getfixturevalue("served")
        return
    runs = [Path(path) for path in MODELS.split(os.pathsep)]
    server = start_server(runs, tmp_path_factory.mktemp("page"), env=child_env(**world.env()))
    yield server
    server.stop()


def test_page_translates_a_paragraph_and_draws_each_sentence(shown: Server, tmp_path) -> None:
    languages = httpx.get(shown.url + "/languages", timeout=60).json()
    source = next(lang for lang in languages if lang["targets"])
    body = {"text": [TEXT], "scores": True, "src_lang": source["code"]}
    body["tgt_lang"] = source["targets"][0]
    expected = httpx.post(shown.url + "/v1/translate", json=body, timeout=60).json()
    folder = Path(SHOTS) if SHOTS else tmp_path
    for width, name in ((1100, "serve-page.png"), (390, "serve-page-phone.png")):
        with open_page(shown.url, width) as page:
            translated = translate_on(page, TEXT)
            listed = page.eval_on_selector_all("#sentences li", "items => items.length")
            rows = int(page.get_attribute("#heatmap", "data-drawn"))
            painted = page.evaluate(PAINTED_CELLS)
            targets = page.eval_on_selector_all("#target option", "os => os.map(o => o.value)")
            can_copy = page.is_enabled("#copy")
            busy = page.get_attribute("body", "aria-busy")
            wide = page.evaluate("document.documentElement.scrollWidth")
            page.screenshot(path=str(folder / name), full_page=True)
        assert translated == expected["translations"][0]
        assert listed == len(expected["sentences"][0]) > 1
        assert rows > 0 and painted > 0, "the heatmap canvas is blank"
        assert targets == source["targets"]
        assert can_copy and busy == "false"
        assert wide <= width, "the page is wider than the window"
        assert (folder / name).stat().st_size > 10_000


def test_errors_are_shown_in_the_page(shown: Server) -> None:
    with open_page(shown.url) as page:
        page.wait_for_selector("#target option", state="attached")
        page.click("#go")
        empty = page.inner_text("#error")
        page.fill("#source", "qb " * 33_334)  # past the request's 100,000 characters
        page.click("#go")
        page.wait_for_function("document.getElementById('error').textContent.includes('max')")
        too_long = page.inner_text("#error")
        still_usable = page.is_enabled("#go")
    assert "Type something" in empty
    assert "--max-chars 100000" in too_long and still_usable
