"""Several models in one server: `serve --model` given three times, a multilingual toy model of
de->en and en->fr and two models of en->de (the same weights under another pair's name),
which form an ensemble. Each pair is answered by its own model, as that model alone answers
it; /languages lists every pair and nothing else is accepted; `auto` finds the source among
every language py3langid knows, and refuses, named, one that no model here translates from; the
page offers a target picker per source, swaps a pair both ways, and
fits a phone-width window.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from helpers.browser import open_page, translate_on
from helpers.clirun import child_env
from helpers.multilingual import multilingual_files, multilingual_raw
from helpers.serving import Server, relabeled, start_server
from helpers.toy import run
from helpers.workspace import World
from typer.testing import CliRunner

import attn_mt
from attn_mt.config.file import config_from_dict
from attn_mt.documents.paragraphs import ParagraphTranslator

GERMAN, ENGLISH = "Ein Mann fährt Fahrrad. Eine Frau liest.", "A man rides a bike."
SPANISH = "Un perro corre en la nieve con un niño."


@pytest.fixture(scope="module")
def models(world: World, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A multilingual toy model of de->en and en->fr (3 updates) and two copies of the
    world's model named en->de."""
    folder = tmp_path_factory.mktemp("routes")
    raw = multilingual_raw(multilingual_files(folder), folder / "multi", ("de-en", "en-fr"))
    raw["model"].update(d_model=32, d_ff=64)
    raw["train"].update(max_steps=3, eval_every=1000, valid_max_sentences=2, samples=0)
    run(config_from_dict(raw))
    best = world.run / "checkpoints" / "best.pt"
    return {
        "multi": folder / "multi",
        "en-de": relabeled(best, folder / "en_de.pt", "en", "de"),
        "en-de copy": relabeled(best, folder / "en_de_copy.pt", "en", "de"),
    }


@pytest.fixture(scope="module")
def routed(models: dict[str, Path], world: World, tmp_path_factory) -> Server:
    server = start_server(
        list(models.values()), tmp_path_factory.mktemp("routed"), env=child_env(**world.env())
    )
    yield server
    assert server.stop() == 0, server.log.read_text()


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def test_each_pair_is_answered_by_its_own_model(routed: Server, models) -> None:
    multi = ParagraphTranslator.splitting(attn_mt.load(models["multi"], device="cpu"))
    ensemble = ParagraphTranslator.splitting(
        attn_mt.load([models["en-de"], models["en-de copy"]], device="cpu")
    )
    expected = {
        ("de", "en"): multi.translate([GERMAN], tgt_lang="en")[0],
        ("en", "fr"): multi.translate([ENGLISH], tgt_lang="fr")[0],
        ("en", "de"): ensemble.translate([ENGLISH])[0],
    }
    for (src, tgt), text in expected.items():
        given = GERMAN if src == "de" else ENGLISH
        libre = post(routed, "/translate", {"q": given, "source": src, "target": tgt})
        assert libre.json() == {"translatedText": text}, (src, tgt)
        own = post(routed, "/v1/translate", {"text": [given], "src_lang": src, "tgt_lang": tgt})
        assert own.json()["translations"] == [text]
    assert httpx.get(routed.url + "/languages").json() == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": ["fr", "de"]},
        {"code": "fr", "name": "French", "targets": []},
    ]
    info = httpx.get(routed.url + "/info").json()
    assert [m["directions"] for m in info["models"]] == [["de-en", "en-fr"], ["en-de"]]
    assert info["models"][1]["paths"] == [str(models["en-de"]), str(models["en-de copy"])]


def test_a_pair_not_served_is_refused(routed: Server) -> None:
    """The multilingual model translates into fr, but not from de: de->fr is refused."""
    for src, tgt in (("de", "fr"), ("fr", "en"), ("de", "de")):
        libre = post(routed, "/translate", {"q": GERMAN, "source": src, "target": tgt})
        assert libre.status_code == 400, (src, tgt)
        assert "it translates de-en, en-fr, en-de" in libre.json()["error"]
        own = post(routed, "/v1/translate", {"text": [GERMAN], "src_lang": src, "tgt_lang": tgt})
        assert own.status_code == 422
    vague = post(routed, "/v1/translate", {"text": [ENGLISH], "src_lang": "en"})
    assert vague.status_code == 422 and "tgt_lang: give it" in vague.json()["error"]


def test_auto_finds_the_source_and_refuses_one_not_served(routed: Server) -> None:
    body = {"q": [GERMAN, ENGLISH], "source": "auto", "target": "en"}
    mixed = post(routed, "/translate", body)
    assert mixed.status_code == 400  # en -> en: not served, as LibreTranslate says
    reply = post(routed, "/translate", {"q": GERMAN, "source": "auto", "target": "en"}).json()
    assert reply["detectedLanguage"]["language"] == "de"
    assert 50 < reply["detectedLanguage"]["confidence"] <= 100
    known = post(routed, "/translate", {"q": GERMAN, "source": "de", "target": "en"}).json()
    assert reply["translatedText"] == known["translatedText"]
    detected = post(routed, "/detect", {"q": ENGLISH}).json()
    assert [d["language"] for d in detected][0] == "en" and len(detected) == 3
    spanish = post(routed, "/translate", {"q": SPANISH, "source": "auto", "target": "en"})
    assert spanish.status_code == 400
    assert "Spanish (es" in spanish.json()["error"] and "de, en" in spanish.json()["error"]
    own = post(routed, "/v1/translate", {"text": [ENGLISH], "src_lang": "auto", "tgt_lang": "fr"})
    assert own.json()["detected_language"]["language"] == "en"


def test_models_of_one_pair_in_two_sets_are_refused(models, world: World, tmp_path) -> None:
    from attn_mt.cli import app
    from attn_mt.errors import UserError

    other = relabeled(world.run / "checkpoints" / "best.pt", tmp_path / "de_en.pt", "de", "en")
    found = CliRunner().invoke(app, ["serve", "-m", str(models["multi"]), "-m", str(other)])
    assert isinstance(found.exception, UserError)
    assert "it translates de-en, as --model" in str(found.exception)


def test_the_page_offers_every_pair(routed: Server) -> None:
    """A target picker per source, a swap where the pair goes both ways, a translation as
    the API gives it, on a desktop and a phone-width window."""
    for width in (1100, 390):
        with open_page(routed.url, width) as page:
            page.wait_for_selector("#target option", state="attached")
            offered = {}
            for source in ("auto", "de", "en"):
                page.select_option("#source-lang", source)
                offered[source] = page.eval_on_selector_all(
                    "#target option", "os => os.map(o => o.value)"
                )
            shown = translate_on(page, GERMAN, "en", "de")
            page.select_option("#source-lang", "en")
            page.select_option("#target", "de")
            swappable = page.is_enabled("#swap")
            page.click("#swap")
            swapped = [page.input_value(s) for s in ("#source-lang", "#target")]
            page.select_option("#source-lang", "en")
            page.select_option("#target", "fr")
            one_way = page.is_enabled("#swap")
            wide = page.evaluate("document.documentElement.scrollWidth")
        assert offered == {"auto": ["en", "fr", "de"], "de": ["en"], "en": ["fr", "de"]}
        body = {"text": [GERMAN], "src_lang": "de", "tgt_lang": "en"}
        assert shown == post(routed, "/v1/translate", body).json()["translations"][0]
        assert swappable and swapped == ["de", "en"] and not one_way
        assert wide <= width, "the page is wider than the window"
