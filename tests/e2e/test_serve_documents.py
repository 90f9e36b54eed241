"""`attn-mt serve` with documents, on the toy server of test_serve.py (a real process on
127.0.0.1): a large page is read off the event loop (/health answers meanwhile); the limits
are a request's whole text (a long paragraph passes, line breaks come back as they were); a
urlencoded form is read as UTF-8; /detect names py3langid's languages with their own
confidence, and `auto` text in a language no model here translates from is refused, named;
LibreTranslate's front end gets its settings; a glossary's terms are constraints of each
sentence that holds a source term, on both APIs as in `attn-mt translate --glossary`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from helpers.serving import Server
from helpers.toy import toy_pairs, write_lines
from helpers.workspace import World, run_cli

FORM = {"content-type": "application/x-www-form-urlencoded"}


def post(server: Server, path: str, body: object) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_a_large_page_is_read_off_the_event_loop(served: Server) -> None:
    """700 KB of markup without text: seconds of reading and writing back, nothing to decode;
    /health, asked meanwhile, waits for none of it."""
    page = "<i></i>" * 100_000
    waits = []
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        reply = pool.submit(post, served, "/v1/translate", {"text": [page], "format": "html"})
        while not reply.done():
            asked = time.monotonic()
            assert httpx.get(served.url + "/health", timeout=60).status_code == 200
            waits.append(time.monotonic() - asked)
            time.sleep(0.05)
        took = time.monotonic() - started
    assert reply.result().status_code == 200, reply.result().text
    assert reply.result().json()["translations"] == [page]
    assert len(waits) >= 3, f"the page took {took:.2f} s: too little to tell"
    assert max(waits) < took / 3, f"/health waited {max(waits):.2f} s of the page's {took:.2f} s"


def test_the_limit_is_a_requests_whole_text(served: Server) -> None:
    """A 12,000-character paragraph is within the default limit (here one /detect reads, as
    cheap to ask as it is to refuse); a text of line breaks comes back as it was."""
    paragraph = ("qb qc qd qf. " * 1000)[:12_000]
    assert post(served, "/detect", {"q": paragraph}).status_code == 200
    info = httpx.get(served.url + "/info").json()["limits"]
    assert info["max_chars"] == 100_000 and info["max_body_bytes"] == 4 << 20
    breaks = ["\n\n", " \n", "\r\n"]
    for path, body, key in (
        ("/v1/translate", {"text": breaks}, "translations"),
        ("/translate", {"q": breaks, "source": "xx", "target": "yy"}, "translatedText"),
    ):
        assert post(served, path, body).json()[key] == breaks


def test_a_form_is_read_as_utf8(served: Server) -> None:
    """Raw UTF-8 (as `curl -d` sends it) and %-escapes read alike, as JSON reads them; a form
    that is not UTF-8 is refused."""
    text = "qb qc läuft"
    json_reply = post(served, "/translate", {"q": text, "source": "xx", "target": "yy"}).json()
    raw = f"q={text}&source=xx&target=yy".encode()
    url = served.url + "/translate"
    assert httpx.post(url, content=raw, headers=FORM).json() == json_reply
    escaped = httpx.post(url, data={"q": text, "source": "xx", "target": "yy"})
    assert escaped.json() == json_reply
    detected = httpx.post(
        served.url + "/detect", content="q=Ein Hund läuft.".encode(), headers=FORM
    )
    assert detected.json()[0]["language"] == "de"
    latin1 = httpx.post(url, content=raw.decode().encode("latin-1"), headers=FORM)
    assert latin1.status_code == 422 and "not UTF-8" in latin1.json()["error"]


def test_detect_names_every_language_py3langid_knows(served: Server) -> None:
    """The toy server translates xx (no language py3langid knows): /detect still answers with
    py3langid's own confidence, and `auto` is refused, naming what it found."""
    found = post(served, "/detect", {"q": "A dog runs in the snow."}).json()
    assert found[0]["language"] == "en" and 50 < found[0]["confidence"] < 100
    assert len(found) == 3 and found == sorted(found, key=lambda d: -d["confidence"])
    for path, body in (
        ("/translate", {"q": "A dog runs in the snow.", "source": "auto", "target": "yy"}),
        ("/v1/translate", {"text": ["A dog runs in the snow."], "src_lang": "auto"}),
    ):
        refused = post(served, path, body)
        assert refused.status_code == (400 if path == "/translate" else 422)
        error = refused.json()["error"]
        assert "English (en" in error and "py3langid never finds xx" in error, error


def test_libretranslates_front_end_gets_its_settings(served: Server) -> None:
    settings = httpx.get(served.url + "/frontend/settings").json()
    assert settings["charLimit"] == 100_000 and settings["keyRequired"] is False
    assert settings["language"] == {
        "source": {"code": "xx", "name": "xx"},
        "target": {"code": "yy", "name": "yy"},
    }
    assert {"frontendTimeout", "apiKeys", "suggestions", "filesTranslation"} <= settings.keys()
    assert settings["supportedFilesFormat"] == []


def test_a_glossary_steers_each_sentence_that_holds_a_term(
    served: Server, world: World, tmp_path: Path
) -> None:
    """Sentences holding `qb` get `Ba` as a term, each on its own (the paragraph stays split);
    LibreTranslate's route and `attn-mt translate --glossary` give the same."""
    sentences = [s for s in toy_pairs(12, seed=21)[0] if "qb" not in s.split()][:2]
    sentences.insert(1, "qc qb qd")
    paragraph = ". ".join(sentences) + "."
    glossary = {"QB": "Ba"}
    reply = post(
        served, "/v1/translate", {"text": [paragraph], "glossary": glossary, "scores": True}
    )
    assert reply.status_code == 200, reply.text
    steered = [
        post(served, "/v1/translate", {"text": [s["source"]], "constraints": [terms]}).json()
        for s, terms in zip(reply.json()["sentences"][0], ([], ["Ba"], []), strict=True)
    ]
    assert [s["text"] for s in reply.json()["sentences"][0]] == [
        r["translations"][0] for r in steered
    ]
    libre = {"q": paragraph, "source": "xx", "target": "yy", "glossary": glossary}
    assert (
        post(served, "/translate", libre).json()["translatedText"]
        == reply.json()["translations"][0]
    )
    lines = write_lines(tmp_path / "in.txt", [f"{s}." for s in sentences])
    terms = write_lines(tmp_path / "terms.tsv", ["QB\tBa"])
    out = tmp_path / "out.txt"
    args = ["translate", "-m", world.run, "-i", lines, "-o", out, "--device", "cpu"]
    result = run_cli([*args, "--prepack", "off", "--glossary", terms], None, world.env())
    assert result.returncode == 0, result.stderr.decode()
    assert out.read_text().splitlines() == [s["text"] for s in reply.json()["sentences"][0]]
