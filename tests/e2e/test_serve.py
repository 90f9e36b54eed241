"""`attn-mt serve` end to end: a real server process on 127.0.0.1, talked to over HTTP.

Replies equal what `attn-mt translate` writes for the same lines and settings (plain, n-best,
alignment, paragraphs split into sentences), also when many clients' requests are batched
together; a paragraph is its sentences translated one by one, a long sentence is translated in
pieces, an HTML page keeps its markup; LibreTranslate's routes answer JSON and forms; bad
requests are 4xx with a JSON error and the server keeps serving; SIGTERM finishes the requests
in flight and exits 0, also with a client that sent half a body.
"""

from __future__ import annotations

import html
import re
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from helpers.clirun import assert_user_error, child_env
from helpers.serving import CLI, Server, start_server, translate_cli
from helpers.toy import toy_pairs
from helpers.workspace import World
from typer.testing import CliRunner

LINES = [*toy_pairs(40, seed=7)[0][:39], ""]  # 40 lines, the last one empty
# Paragraphs of the toy words: sentences end at ". ", "! " and "? ", one at a line break.
SENTENCES = toy_pairs(12, seed=8)[0]
PARAGRAPHS = [
    f"{SENTENCES[0]}. {SENTENCES[1]}! {SENTENCES[2]}?",
    f"  {SENTENCES[3]}.  {SENTENCES[4]}.",
    SENTENCES[5],
    f"{SENTENCES[6]}. {SENTENCES[7]}. {SENTENCES[8]}. {SENTENCES[9]}. {SENTENCES[10]}.",
]


@pytest.fixture(scope="module")
def reference(world: World) -> dict[str, str]:
    """`attn-mt translate` of LINES: plain, and 3-best with alignments; and of PARAGRAPHS with
    --split-sentences (three runs at once)."""
    env = child_env(**world.env())
    runs = {
        "plain": (LINES, ()),
        "nbest": (LINES, ("--nbest", "3", "--alignment")),
        "split": (PARAGRAPHS, ("--split-sentences",)),
    }
    with ThreadPoolExecutor(3) as pool:
        outputs = {
            name: pool.submit(translate_cli, world.run, lines, "--prepack", "off", *args, env=env)
            for name, (lines, args) in runs.items()
        }
    return {name: future.result() for name, future in outputs.items()}


def post(server: Server, path: str, body: object, **headers: str) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def test_translate_equals_the_command_line(served: Server, reference: dict[str, str]) -> None:
    reply = post(served, "/v1/translate", {"text": LINES})
    assert reply.status_code == 200, reply.text
    assert "".join(f"{t}\n" for t in reply.json()["translations"]) == reference["plain"]


def test_nbest_and_alignment_equal_the_command_line(served, reference) -> None:
    reply = post(served, "/v1/translate", {"text": LINES, "nbest": 3, "alignment": True})
    assert reply.status_code == 200, reply.text
    written = ""
    for entries in reply.json()["translations"]:
        assert len(entries) == 3
        for e in entries:
            pairs = " ".join(f"{i}-{j}" for i, j in e["alignment"])
            written += f"{e['score']:.4f}\t{e['text']} ||| {pairs}\n"
        written += "\n"
    assert written == reference["nbest"]


def test_concurrent_clients_get_their_own_answers(served, reference) -> None:
    """32 clients at once, each with its own 1-3 lines: batched together, answered apart."""
    expected = reference["plain"].splitlines()
    chunks = [(i, LINES[i : i + 1 + i % 3]) for i in range(0, 32)]

    def ask(chunk: tuple[int, list[str]]) -> tuple[int, list[str]]:
        start, lines = chunk
        return start, post(served, "/v1/translate", {"text": lines}).json()["translations"]

    batches_before = httpx.get(served.url + "/info").json()["batching"]["batches_decoded"]
    with ThreadPoolExecutor(32) as pool:
        for start, got in pool.map(ask, chunks):
            assert got == expected[start : start + len(got)]
    batches = httpx.get(served.url + "/info").json()["batching"]["batches_decoded"]
    assert batches - batches_before < len(chunks), "requests were not batched together"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"text": ["qb"] * 65}, 413, "--max-lines 64"),
        ({"text": ["qb " * 20_000] * 2}, 413, "--max-chars 100000"),  # the request's text
        ({"text": ["qb"], "beam": 0}, 422, "beam"),
        ({"text": ["qb"], "beam": 301}, 422, "target vocabulary (300 pieces)"),
        ({"text": ["qb"], "beam": 401}, 413, "--max-beam 400"),
        ({"text": ["qb"], "nbest": 3, "beam": 2}, 422, "nbest"),
        ({"text": ["qb"], "colour": "red"}, 422, "colour: Extra inputs are not permitted"),
        ({"text": "qb"}, 422, "text"),
        ({"text": [1]}, 422, "text.0"),
        ({"text": ["qb"], "beam": "2"}, 422, "beam"),
        ({"text": ["qb"], "prefix": ["a", "b"]}, 422, "prefix: give one entry per line"),
        ({"text": ["qb"], "avoid": ["x"], "constraints": [["x"]]}, 422, "avoided word"),
        ({"text": ["qb"], "tgt_lang": "fr"}, 422, "it translates xx-yy"),
        ({"text": ["qb"], "src_lang": "de"}, 422, "de -> *: not a pair"),
        ([1, 2], 422, "body"),
        ({"text": ["qb", " "], "prefix": [None, "Ba"]}, 422, "line 2: the source is blank"),
        ({"text": ["", "qb"], "constraints": [["Ba"], []]}, 422, "line 1: the source is blank"),
        ({"text": ["qb"], "constraints": [["Ba"] * 9]}, 413, "--max-terms 8"),
        ({"text": ["qb"], "avoid": ["Ba"] * 65}, 413, "--max-avoid 64"),
        ({"text": ["qb"], "prefix": ["Ba" * 50_000]}, 413, "--max-chars 100000"),
        ({"text": ["qb"], "glossary": {"qb": "Ba" * 50_000}}, 413, "--max-chars 100000"),
        ({"text": ["qb"], "glossary": {"qb": ""}}, 422, "glossary: a target term is empty"),
        ({"text": ["<p>qb</p>"], "format": "html", "alignment": True}, 422, "format html"),
        ({"text": ["qb"], "format": "pdf"}, 422, "format"),
    ],
)
def test_bad_requests_are_4xx_and_the_server_serves_on(served, body, status, words) -> None:
    reply = post(served, "/v1/translate", body)
    assert reply.status_code == status, reply.text
    assert words in reply.json()["error"]
    assert post(served, "/v1/translate", {"text": ["qb qc"]}).status_code == 200


def test_malformed_bodies(served: Server) -> None:
    url = served.url + "/v1/translate"
    json_type = {"content-type": "application/json"}
    broken = httpx.post(url, content=b'{"text": ["qb"', headers=json_type)
    assert broken.status_code == 422 and "JSON" in broken.json()["error"]
    huge = httpx.post(url, content=b"x" * (5 << 20), headers=json_type)
    assert huge.status_code == 413 and "--max-body-bytes" in huge.json()["error"]
    chunks = (b"x" * (64 << 10) for _ in range(80))  # 5 MiB without a Content-Length
    chunked = httpx.post(url, content=chunks, headers=json_type)
    assert chunked.status_code == 413 and "--max-body-bytes" in chunked.json()["error"]
    for path, body in (("/v1/translate", b'{"text": ["qb \\ud800"]}'), ("/translate", LONE_Q)):
        lone = httpx.post(served.url + path, content=body, headers=json_type)
        assert lone.status_code == 422 and "lone surrogate" in lone.json()["error"], lone.text
    assert post(served, "/v1/translate", {"text": ["qb qc"]}).status_code == 200


LONE_Q = b'{"q": "qb \\udc80", "source": "xx", "target": "yy"}'


def test_paragraphs_are_their_sentences_translated_one_by_one(served, reference) -> None:
    """As `translate --split-sentences` writes them, each with the paragraph's own leading and
    trailing whitespace, which the server keeps (a line's ends the command line leaves out, as
    the Translator strips a line); each sentence as it is alone, joined with the paragraph's
    own spacing; LibreTranslate's route gives every sentence too."""
    reply = post(served, "/v1/translate", {"text": PARAGRAPHS, "scores": True}).json()
    written = reference["split"].split("\n")
    assert written[-1] == "" and len(written) - 1 == len(PARAGRAPHS)
    assert reply["translations"] == [
        p[: len(p) - len(p.lstrip())] + line + p[len(p.rstrip()) :]
        for p, line in zip(PARAGRAPHS, written, strict=False)
    ]
    assert reply["translations"][1].startswith("  ") and not written[1].startswith(" ")
    sentences = reply["sentences"][0]
    assert [s["source"] for s in sentences] == [
        f"{SENTENCES[0]}.",
        f"{SENTENCES[1]}!",
        f"{SENTENCES[2]}?",
    ]
    one_by_one = [post(served, "/v1/translate", {"text": [s["source"]]}).json() for s in sentences]
    assert [s["text"] for s in sentences] == [r["translations"][0] for r in one_by_one]
    assert reply["translations"][0] == " ".join(s["text"] for s in sentences)
    second = [s["text"] for s in reply["sentences"][1]]
    assert reply["translations"][1] == f"  {second[0]}  {second[1]}"  # the paragraph's spacing
    assert all(s["score"] < 0 for s in sentences)
    libre = post(served, "/translate", {"q": PARAGRAPHS[3], "source": "xx", "target": "yy"})
    assert libre.json()["translatedText"] == reply["translations"][3]  # all five sentences
    whole = post(served, "/v1/translate", {"text": PARAGRAPHS[:1], "split_sentences": False})
    assert whole.json()["translations"][0] != reply["translations"][0]


def test_a_long_sentence_is_translated_in_pieces(served: Server) -> None:
    words = " ".join(SENTENCES * 10).split()[:400]
    long = " ".join(words)  # 400 words: more pieces than the model reads
    reply = post(served, "/v1/translate", {"text": [long], "scores": True}).json()
    pieces = reply["sentences"][0]
    assert len(pieces) > 1 and " ".join(p["source"] for p in pieces) == long
    assert reply["translations"][0] == " ".join(p["text"] for p in pieces)


PAGE = (
    "<!DOCTYPE html><html><head><title>{0}</title><style>p {{ color: red }}</style></head>"
    "<body><!-- a note --><h1>{1}</h1>\n<p>{2} <b>{3} <i>{4}</i></b> &amp; {5}.</p>"
    '<p><a href="/x?a=1&amp;b=2">{6}</a>. {7}</p><script>var s = "<p>{8}</p>";</script>'
    "<pre>{8}</pre><div>{9} <b>{10} <i>{11}</b> qb</i><p>qc</div></span>"
)


def test_html_pages_keep_their_markup(served: Server) -> None:
    from attn_mt.documents.markup import Page

    page = PAGE.format(*SENTENCES)
    blocks = Page(page).texts
    for route, body in (
        ("/v1/translate", {"text": [page], "format": "html"}),
        ("/translate", {"q": [page], "source": "xx", "target": "yy", "format": "html"}),
    ):
        reply = post(served, route, body)
        assert reply.status_code == 200, reply.text
        out = reply.json()["translations" if route == "/v1/translate" else "translatedText"][0]
        assert re.findall("<[^>]*>", out) == re.findall("<[^>]*>", page)
        assert f'<script>var s = "<p>{SENTENCES[8]}</p>";</script><pre>{SENTENCES[8]}</pre>' in out
        text = html.unescape(re.sub(r"(?s)<(script|pre|style)>.*?</\1>|<[^>]*>", " ", out))
        translated = post(served, "/v1/translate", {"text": blocks}).json()["translations"]
        assert text.split() == " ".join(translated).split()  # every text node, translated


def test_tgt_lang_and_libretranslate_routes(served, reference) -> None:
    expected = reference["plain"].splitlines()
    own = post(served, "/v1/translate", {"text": LINES[:2], "tgt_lang": "yy", "src_lang": "xx"})
    assert own.json()["translations"] == expected[:2]
    assert httpx.get(served.url + "/languages").json() == [
        {"code": "xx", "name": "xx", "targets": ["yy"]},
        {"code": "yy", "name": "yy", "targets": []},
    ]
    one = post(served, "/translate", {"q": LINES[0], "source": "xx", "target": "yy"})
    assert one.json() == {"translatedText": expected[0]}
    form = {"q": LINES[0], "source": "xx", "target": "yy"}
    for sent in ({"data": form}, {"files": {k: (None, v) for k, v in form.items()}}):
        reply = httpx.post(served.url + "/translate", timeout=60, **sent)
        assert reply.json() == {"translatedText": expected[0]}, reply.text
    three = post(served, "/v1/translate", {"text": LINES[:1], "nbest": 3}).json()
    alternatives = post(served, "/translate", {**form, "alternatives": 2}).json()
    assert alternatives["alternatives"] == [e["text"] for e in three["translations"][0][1:]]
    for refused in ({**form, "source": "de"}, {**form, "target": "en"}):
        reply = post(served, "/translate", refused)
        assert reply.status_code == 400 and "it translates xx-yy" in reply.json()["error"]
    assert post(served, "/translate", {**form, "alternatives": "2"}).status_code == 422


def test_health_info_page_docs_attention(served: Server) -> None:
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}
    info = httpx.get(served.url + "/info").json()
    [model] = info["models"]
    assert model["directions"] == ["xx-yy"] and model["parameters"] > 0
    assert model["decode"]["beam"] == 2 and info["version"]
    assert model["linear_layers"] in ("prepacked", "plain")  # float32: --prepack auto's choice
    assert info["sentence_splitter"].startswith("sentencex")
    assert "<canvas" in httpx.get(served.url + "/").text
    assert httpx.get(served.url + "/docs").status_code == 200
    assert "/v1/translate" in httpx.get(served.url + "/openapi.json").json()["paths"]
    found = post(served, "/v1/attention", {"text": LINES[0]}).json()
    assert len(found["weights"]) == len(found["target"])
    assert all(len(row) == len(found["source"]) for row in found["weights"])


LONG = " ".join(toy_pairs(30, seed=9)[0])  # ~180 words: ~256 source tokens, as long as allowed


KEY = "s3crét-ключ"  # not ASCII: compared as UTF-8 bytes


@pytest.fixture(scope="module")
def slow_server(world: World, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """A server with an API key (in a UTF-8 file with a byte-order mark) that decodes one line
    per batch (batching off)."""
    tmp_path = tmp_path_factory.mktemp("slow-serve")
    key = tmp_path / "key"
    key.write_bytes(b"\xef\xbb\xbf" + f"{KEY}\n".encode())
    key.chmod(0o600)
    server = start_server(
        world.run,
        tmp_path,
        "--api-key-file",
        str(key),
        "--max-batch-tokens",
        "1",
        "--max-wait-ms",
        "0",
        env=child_env(**world.env()),
    )
    yield server
    server.stop()


AUTH = {"Authorization": b"Bearer " + KEY.encode()}


def test_api_key(slow_server: Server) -> None:
    assert httpx.get(slow_server.url + "/health").status_code == 200
    for path in ("/info", "/languages", "/", "/docs", "/openapi.json"):
        assert httpx.get(slow_server.url + path).status_code == 401
        assert httpx.get(slow_server.url + path, headers=AUTH).status_code == 200
    for wrong in (b"Bearer no", b"Bearer s3cr\xc3\xa9t", b"Bearer \xff\xfe"):
        refused = post(slow_server, "/v1/translate", {"text": ["qb"]}, Authorization=wrong)
        assert refused.status_code == 401 and "API key" in refused.json()["error"]
    assert post(slow_server, "/v1/translate", {"text": ["qb"]}, **AUTH).status_code == 200
    libre = {"q": "qb", "source": "xx", "target": "yy", "api_key": KEY}
    assert post(slow_server, "/translate", libre).status_code == 200
    url = slow_server.url + "/translate"
    assert httpx.post(url, data=libre, timeout=60).status_code == 200  # a form's key
    raw = f"q=qb&source=xx&target=yy&api_key={KEY}".encode()  # raw UTF-8, as `curl -d` sends
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert httpx.post(url, content=raw, headers=form, timeout=60).status_code == 200
    settings = httpx.get(slow_server.url + "/frontend/settings")  # no key: it says one is needed
    assert settings.status_code == 200 and settings.json()["keyRequired"] is True
    assert post(slow_server, "/translate", {**libre, "api_key": "s3cret"}).status_code == 401
    lone = b'{"q": "qb", "source": "xx", "target": "yy", "api_key": "\\ud800"}'
    assert httpx.post(url, content=lone, timeout=60).status_code == 401
    assert "readable by other users" not in slow_server.log.read_text()  # its mode is 600


def test_disconnect_drops_the_rest_and_sigterm_finishes_in_flight(slow_server: Server) -> None:
    """A client that gives up costs only the batch under way; SIGTERM mid-batch lets the
    requests in flight finish (and /health answers meanwhile), gives up a body still arriving,
    then exits 0 within seconds."""
    info = slow_server.url + "/info"
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            slow_server.url + "/v1/translate", json={"text": [LONG] * 64}, headers=AUTH, timeout=0.5
        )
    time.sleep(1.0)
    dropped_at = httpx.get(info, headers=AUTH).json()["batching"]["batches_decoded"]
    time.sleep(0.5)
    assert httpx.get(info, headers=AUTH).json()["batching"]["batches_decoded"] == dropped_at < 64

    replies: list[httpx.Response] = []
    body = {"text": [LONG] * 6 + ["qb qc"]}
    clients = [
        threading.Thread(
            target=lambda: replies.append(post(slow_server, "/v1/translate", body, **AUTH))
        )
        for _ in range(2)
    ]
    for client in clients:
        client.start()
    half = half_sent(slow_server)
    time.sleep(0.5)
    started = time.monotonic()
    assert httpx.get(slow_server.url + "/health").status_code == 200
    assert time.monotonic() - started < 0.5, "/health waited for the batch"
    assert slow_server.stop(timeout=120) == 0, slow_server.log.read_text()
    for client in clients:
        client.join()
    assert [r.status_code for r in replies] == [200, 200]
    assert all(len(r.json()["translations"]) == 7 for r in replies)
    answer = half.recv(4096)
    assert answer == b"" or b" 503 " in answer.split(b"\r\n")[0], answer


def half_sent(server: Server) -> socket.socket:
    """A connection that sent the headers and half the body of a request, then stalls."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    head = f"POST /v1/translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n"
    conn.sendall(head.encode() + b'{"text": ["qb')
    conn.settimeout(60)
    return conn


def test_startup_errors(world: World, tmp_path: Path, monkeypatch) -> None:
    """Each a one-line error before the model loads: a missing model, the extra, absurd
    --max-wait-ms, a key file that is empty, not UTF-8 or holds a control character."""
    from attn_mt.cli import app
    from attn_mt.errors import UserError

    def refused(*args: str) -> str:
        found = CliRunner().invoke(app, ["serve", "--model", str(world.run), *args])
        assert isinstance(found.exception, UserError), found.output
        return str(found.exception)

    assert "nothing" in refused("--model", str(tmp_path / "nothing"))
    for wait in ("inf", "nan", "1e9", "-1"):
        assert "--max-wait-ms" in refused("--max-wait-ms", wait)
    for name, content, words in (
        ("empty", b"\xef\xbb\xbf\n", "is empty"),
        ("latin1", b"cl\xe9\n", "not UTF-8"),
        ("control", b"a\x00b\n", "control character"),
    ):
        (tmp_path / name).write_bytes(content)
        assert words in refused("--api-key-file", str(tmp_path / name))
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert "pip install 'attn-mt[serve]'" in refused()


def test_the_models_load_and_warm_on_the_decode_thread(world: World, monkeypatch) -> None:
    """Torch's CPU threads are an OpenMP pool of each thread that computes: a model loaded and
    warmed on the main thread and decoded on the worker made two pools, whose threads then
    slept at every barrier, and a search ran at half its speed (serve.batcher). Everything that
    computes runs on the worker."""
    import attn_mt
    from attn_mt.cli import app

    seen: list[tuple[str, str]] = []
    services: list = []
    real_load = attn_mt.load

    def load(*args, **kwargs):
        seen.append(("load", threading.current_thread().name))
        translator = real_load(*args, **kwargs)
        real_nbest = translator.translate_nbest

        def nbest(*a, **k):
            seen.append(("translate", threading.current_thread().name))
            return real_nbest(*a, **k)

        translator.translate_nbest = nbest
        return translator

    monkeypatch.setattr(attn_mt, "load", load)
    monkeypatch.setattr(
        "attn_mt.serve.app.create_app", lambda service, key: services.append(service)
    )
    monkeypatch.setattr("attn_mt.cli.serve._run", lambda _app, listener: listener.close())
    result = CliRunner().invoke(app, ["serve", "--model", str(world.run), "--port", "0"])
    for service in services:
        service.batcher.stop()
    assert result.exit_code == 0, result.output
    assert [what for what, _ in seen] == ["load", "translate"]  # the warm-up translation
    assert {thread for _, thread in seen} == {"attn-mt-decode"}


def test_exposure_is_warned_of(tmp_path: Path, capsys) -> None:
    from attn_mt.cli.serve import _warn_exposed

    key = tmp_path / "key"
    key.write_text("k\n")
    key.chmod(0o644)
    _warn_exposed("0.0.0.0", None)
    _warn_exposed("127.0.0.1", key)
    _warn_exposed("::1", None)
    _warn_exposed("localhost", None)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert "--host 0.0.0.0 listens beyond this machine" in lines[0] and "--api-key-file" in lines[0]
    assert f"--api-key-file {key} is readable by other users" in lines[1]


def test_bad_model_exits_before_binding(world: World, tmp_path: Path) -> None:
    """A user error at start: one `attn-mt: error:` line, exit 2, no traceback."""
    result = subprocess.run(
        [*CLI, "serve", "--model", str(tmp_path / "missing.pt"), "--port", "0"],
        capture_output=True,
        env=child_env(**world.env()),
        timeout=120,
    )
    assert_user_error(result, "missing.pt")
