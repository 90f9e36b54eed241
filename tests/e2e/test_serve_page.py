"""The page at GET / in a real headless Chromium: type a sentence, click, and the translation
and its cross-attention heatmap appear (`helpers.browser` says what the test needs).
"""

from __future__ import annotations

import httpx
from helpers.browser import open_page, translate_on
from helpers.serving import Server


def test_page_translates_and_draws_the_heatmap(served: Server) -> None:
    sentence = "qb qc qd qf"
    expected = httpx.post(served.url + "/v1/translate", json={"text": [sentence]}).json()
    with open_page(served.url) as page:
        shown = translate_on(page, sentence)
        rows = int(page.get_attribute("#heatmap", "data-drawn"))
        painted = page.evaluate(_PAINTED_CELLS)
        picker_hidden = page.is_hidden("#into")  # its languages were asked for before the click
    assert shown == expected["translations"][0]
    assert rows > 0 and painted > 0, "the heatmap canvas is blank"
    assert picker_hidden, "a bilingual model's page offers a choice of target language"


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
