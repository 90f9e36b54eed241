"""`attn-mt serve` end to end: a real server process on 127.0.0.1, talked to over HTTP.

Replies equal what `attn-mt translate` writes for the same lines and settings (plain, n-best,
alignment), also when many clients' requests are batched together; bad requests are 4xx with
a JSON error and the server keeps serving; SIGTERM finishes the requests in flight and exits 0.
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def reference(world: World) -> dict[str, str]:
    """`attn-mt translate` of LINES: plain, and 3-best with alignments (two runs at once)."""
    env = child_env(**world.env())
    runs = {"plain": (), "nbest": ("--nbest", "3", "--alignment")}
    with ThreadPoolExecutor(2) as pool:
        outputs = {
            name: pool.submit(translate_cli, world.run, LINES, "--prepack", "off", *args, env=env)
            for name, args in runs.items()
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
        ({"text": ["qb " * 1000]}, 413, "--max-chars 2000"),
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
        ({"text": ["qb"], "tgt_lang": "fr"}, 422, "xx -> yy"),
        ([1, 2], 422, "body"),
    ],
)
def test_bad_requests_are_4xx_and_the_server_serves_on(served, body, status, words) -> None:
    reply = post(served, "/v1/translate", body)
    assert reply.status_code == status, reply.text
    assert words in reply.json()["error"]
    assert post(served, "/v1/translate", {"text": ["qb qc"]}).status_code == 200


def test_malformed_bodies(served: Server) -> None:
    url = served.url + "/v1/translate"
    broken = httpx.post(
        url, content=b'{"text": ["qb"', headers={"content-type": "application/json"}
    )
    assert broken.status_code == 422 and "JSON" in broken.json()["error"]
    huge = httpx.post(url, content=b"x" * (2 << 20), headers={"content-type": "application/json"})
    assert huge.status_code == 413 and "--max-body-bytes" in huge.json()["error"]
    assert post(served, "/v1/translate", {"text": ["qb qc"]}).status_code == 200


def test_tgt_lang_and_libretranslate_routes(served, reference) -> None:
    expected = reference["plain"].splitlines()
    own = post(served, "/v1/translate", {"text": LINES[:2], "tgt_lang": "yy"})
    assert own.json()["translations"] == expected[:2]
    assert httpx.get(served.url + "/languages").json() == [
        {"code": "xx", "name": "xx", "targets": ["yy"]},
        {"code": "yy", "name": "yy", "targets": []},
    ]
    one = post(served, "/translate", {"q": LINES[0], "source": "xx", "target": "yy"})
    assert one.json() == {"translatedText": expected[0]}
    many = post(served, "/translate", {"q": LINES[:3], "source": "auto", "target": "yy"})
    assert many.json() == {"translatedText": expected[:3]}
    assert (
        post(served, "/translate", {"q": "qb", "source": "de", "target": "yy"}).status_code == 400
    )
    assert (
        post(served, "/translate", {"q": "qb", "source": "xx", "target": "en"}).status_code == 422
    )


def test_health_info_page_docs_attention(served: Server) -> None:
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}
    info = httpx.get(served.url + "/info").json()
    assert info["source_language"] == "xx" and info["parameters"] > 0
    assert info["decode"]["beam"] == 2 and info["version"]
    assert info["linear_layers"] in ("prepacked", "plain")  # float32: --prepack auto's choice
    assert "<canvas" in httpx.get(served.url + "/").text
    assert httpx.get(served.url + "/docs").status_code == 200
    assert "/v1/translate" in httpx.get(served.url + "/openapi.json").json()["paths"]
    found = post(served, "/v1/attention", {"text": LINES[0]}).json()
    assert len(found["weights"]) == len(found["target"])
    assert all(len(row) == len(found["source"]) for row in found["weights"])


LONG = " ".join(toy_pairs(30, seed=9)[0])  # ~180 words: ~256 source tokens, as long as allowed


@pytest.fixture(scope="module")
def slow_server(world: World, tmp_path_factory: pytest.TempPathFactory) -> Server:
    """A server with an API key that decodes one line per batch (batching off)."""
    tmp_path = tmp_path_factory.mktemp("slow-serve")
    key = tmp_path / "key"
    key.write_text("s3cret\n")
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


AUTH = {"Authorization": "Bearer s3cret"}


def test_api_key(slow_server: Server) -> None:
    assert httpx.get(slow_server.url + "/health").status_code == 200
    for path in ("/info", "/languages", "/"):
        assert httpx.get(slow_server.url + path).status_code == 401
        assert httpx.get(slow_server.url + path, headers=AUTH).status_code == 200
    refused = post(slow_server, "/v1/translate", {"text": ["qb"]}, Authorization="Bearer no")
    assert refused.status_code == 401 and "API key" in refused.json()["error"]
    assert post(slow_server, "/v1/translate", {"text": ["qb"]}, **AUTH).status_code == 200
    libre = {"q": "qb", "source": "xx", "target": "yy", "api_key": "s3cret"}
    assert post(slow_server, "/translate", libre).status_code == 200


def test_disconnect_drops_the_rest_and_sigterm_finishes_in_flight(slow_server: Server) -> None:
    """A client that gives up costs only the batch under way; SIGTERM mid-batch lets the
    requests in flight finish (and /health answers meanwhile), then exits 0."""
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
    time.sleep(0.5)
    started = time.monotonic()
    assert httpx.get(slow_server.url + "/health").status_code == 200
    assert time.monotonic() - started < 0.5, "/health waited for the batch"
    assert slow_server.stop() == 0, slow_server.log.read_text()
    for client in clients:
        client.join()
    assert [r.status_code for r in replies] == [200, 200]
    assert all(len(r.json()["translations"]) == 7 for r in replies)


def test_startup_errors(world: World, tmp_path: Path, monkeypatch) -> None:
    from attn_mt.cli import app
    from attn_mt.errors import UserError

    missing = CliRunner().invoke(app, ["serve", "--model", str(tmp_path / "nothing")])
    assert isinstance(missing.exception, UserError) and "nothing" in str(missing.exception)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    no_extra = CliRunner().invoke(app, ["serve", "--model", str(world.run)])
    assert "pip install 'attn-mt[serve]'" in str(no_extra.exception)


def test_bad_model_exits_before_binding(world: World, tmp_path: Path) -> None:
    """A user error at start: one `attn-mt: error:` line, exit 2, no traceback."""
    result = subprocess.run(
        [*CLI, "serve", "--model", str(tmp_path / "missing.pt"), "--port", "0"],
        capture_output=True,
        env=child_env(**world.env()),
        timeout=120,
    )
    assert_user_error(result, "missing.pt")
